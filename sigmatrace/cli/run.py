"""`sigmatrace run`: run a command with the native tracer preloaded.

    sigmatrace run [-o DIR] [--mode M] [--providers LIST] -- CMD ARGS...

The command replaces this process (exec), so its exit status, signals,
stdin/stdout/stderr and process id are exactly its own; under mpirun, srun or
torchrun every rank runs `sigmatrace run` and writes its own file
(<host>.<pid>.r<rank>.<uid>.trace) into the shared output directory.  The
configuration travels as SIGMATRACE_* environment variables (docs/tracer.md),
so children the command starts are traced too.
"""
import argparse
import os
import sys

from .. import _native
from ..errors import SigmatraceError

MODES = ("aggregate", "simple", "full")
PROVIDERS = ("ibv", "mlx5", "cuda", "ucx", "ofi", "nccl")
_ALIASES = {"ibverbs": "ibv", "mlx5dv": "mlx5", "libfabric": "ofi"}


class RunError(SigmatraceError):
    """Usage or setup error of `sigmatrace run` (one line, exit status 2)."""


def register(subparsers):
    p = subparsers.add_parser(
        "run",
        help="run a command with the tracer preloaded",
        description="Run CMD with libsigmatrace.so preloaded. Each traced process writes one file "
        "<host>.<pid>.r<rank>.<uid>.trace into the output directory; several ranks may share it.",
        epilog="Everything after -- is the command. Environment variables SIGMATRACE_* (see docs/tracer.md) "
        "set further options (SIGMATRACE_BUFFER_KB, SIGMATRACE_CHUNKS, SIGMATRACE_DROP_POLICY, ...).",
    )
    p.add_argument("-o", "--output", metavar="DIR", default="sigmatrace-trace",
                   help="output directory (created if missing; default: %(default)s)")
    p.add_argument("--mode", choices=MODES, default=None,
                   help="aggregate: counters only; simple (default): timestamped operations without polling; "
                   "full: every call incl. polling and completions")
    p.add_argument("--providers", metavar="LIST", default=None,
                   help="comma-separated subset of " + ",".join(PROVIDERS) + " (or all/none; default: all)")
    p.add_argument("--buffer-kb", type=int, default=None, metavar="KB", help="chunk size per thread buffer in KiB")
    p.add_argument("--writer", choices=("process", "thread"), default=None,
                   help="who writes the trace files: process (default; a process that loaded the CUDA driver first keeps "
                   "the thread unless this is given): a consumer process per traced process drains shared-memory "
                   "rings, no thread is added to the program; thread: a writer thread inside each traced process")
    p.add_argument("--eager", action="store_true",
                   help="create the trace file at start even if the program never calls a traced library")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS...")
    p.set_defaults(func=run)


def _providers(value):
    names = [v.strip().lower() for v in value.split(",") if v.strip()]
    if not names:
        raise RunError("--providers: empty list (use 'none' to trace nothing)")
    out = []
    for n in names:
        n = _ALIASES.get(n, n)
        if n in ("all", "none"):
            if len(names) > 1:
                raise RunError(f"--providers: '{n}' cannot be combined with other names")
            return n
        if n not in PROVIDERS:
            raise RunError(f"--providers: unknown provider '{n}' (known: {', '.join(PROVIDERS)}, all, none)")
        if n not in out:
            out.append(n)
    return ",".join(out)


def build_env(args, base=None):
    """The environment the command runs with (also used by tests)."""
    lib = _native.tracer_library()
    if lib is None:
        raise RunError("the native tracer libsigmatrace.so was not found (build it: cmake -S native -B build/dev "
                       "&& cmake --build build/dev, or pip install .; or set SIGMATRACE_LIB_DIR)")
    env = dict(os.environ if base is None else base)
    out = os.path.abspath(args.output)
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        raise RunError(f"cannot create output directory {out}: {e.strerror}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise RunError(f"output directory {out} is not writable")
    preload = [str(lib)] + [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split() if p and p != str(lib)]
    env["LD_PRELOAD"] = " ".join(preload)
    env["SIGMATRACE_OUTPUT_DIR"] = out
    env.setdefault("SIGMATRACE_LAUNCHER", "sigmatrace-run")
    if args.mode:
        env["SIGMATRACE_MODE"] = args.mode
    if args.providers is not None:
        env["SIGMATRACE_PROVIDERS"] = _providers(args.providers)
    if args.buffer_kb is not None:
        if not 1 <= args.buffer_kb <= 16384:
            raise RunError("--buffer-kb must be between 1 and 16384")
        env["SIGMATRACE_BUFFER_KB"] = str(args.buffer_kb)
    if args.eager:
        env["SIGMATRACE_EAGER"] = "1"
    if getattr(args, "writer", None):
        env["SIGMATRACE_WRITER"] = args.writer
    return env


def run(args):
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise RunError("no command given (usage: sigmatrace run [-o DIR] [--mode M] [--providers LIST] -- CMD ARGS...)")
    env = build_env(args)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(cmd[0], cmd, env)
    except FileNotFoundError:
        print(f"sigmatrace run: command not found: {cmd[0]}", file=sys.stderr)
        return 127
    except PermissionError:
        print(f"sigmatrace run: permission denied: {cmd[0]}", file=sys.stderr)
        return 126
    except OSError as e:
        print(f"sigmatrace run: cannot run {cmd[0]}: {e.strerror}", file=sys.stderr)
        return 126
