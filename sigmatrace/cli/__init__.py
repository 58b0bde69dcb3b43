"""The `sigmatrace` command.  One module per subcommand (cli/<name>.py), each
exposing ``register(subparsers)``; main.py wires them and turns every
SigmatraceError into a one-line message (never a traceback)."""
