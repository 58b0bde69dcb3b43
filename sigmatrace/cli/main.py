"""Entry point of the `sigmatrace` command."""
import argparse
import importlib
import sys

from .. import __version__
from ..errors import SigmatraceError
from .args import DefaultsFormatter, OneLineParser

# Subcommands in the order `--help` lists them.  Each is a module in this
# package with register(subparsers) that sets `func` on its parser.
SUBCOMMANDS = ("run", "report", "replay", "sim", "query", "doctor")


class CliError(SigmatraceError):
    """A usage error reported as one line, exit status 2."""


def not_implemented(name):
    def run(args):
        print(f"sigmatrace {name}: not implemented yet in this version", file=sys.stderr)
        return 3

    return run


def build_parser():
    parser = OneLineParser(
        prog="sigmatrace", formatter_class=DefaultsFormatter,
        description="Library-agnostic tracing of CPU- and GPU-initiated RDMA (verbs, mlx5dv/DevX doorbells, "
        "CUDA, UCX, libfabric), with a SimPy testbed for replay and what-if.",
    )
    parser.add_argument("--version", action="version", version=f"sigmatrace {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            mod = importlib.import_module(f".{name}", __package__)
        except ModuleNotFoundError as e:
            if e.name != f"{__package__}.{name}":
                raise
            p = sub.add_parser(name, help=f"({name}: not implemented yet)")
            p.add_argument("rest", nargs=argparse.REMAINDER)
            p.set_defaults(func=not_implemented(name))
            continue
        mod.register(sub)
    for name, p in sub.choices.items():
        p.formatter_class = DefaultsFormatter
        p.set_defaults(subparser=p)
    return parser


def main(argv=None):
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # options may stand between a command's positionals (`query R --format csv "SQL"`): argparse then
        # leaves the later positional over; a command that takes it says so (absorb_extra)
        absorb = getattr(args, "absorb_extra", None)
        if absorb is None or not absorb(args, extra):
            sub = getattr(args, "subparser", parser)
            sub.error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = args.func(args)
    except KeyboardInterrupt:
        return 130
    except SigmatraceError as e:
        print(f"sigmatrace {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    return 0 if rc is None else int(rc)


if __name__ == "__main__":
    sys.exit(main())
