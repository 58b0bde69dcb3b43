"""Argument types of the CLI: a bad value is a one-line usage error naming the option, never a traceback
deep inside the model or the correlator."""
import argparse


def _int(text):
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _float(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if v != v or v in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return v


def _at_least(parse, low, what):
    """An argument type: ``parse`` the text, then refuse values below ``low``."""
    def check(text):
        v = parse(text)
        if v < low:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return v
    check.__name__ = f"{parse.__name__.strip('_')}_at_least_{low}"
    return check


positive_int = _at_least(_int, 1, "at least 1")
nonneg_int = _at_least(_int, 0, "0 or more")
nonneg_float = _at_least(_float, 0, "0 or more")


def queue_depth(text):
    """An SQ depth in WQEBBs: a power of two, 2 .. 2^15 (the PRM's log_sq_size; the 16-bit producer index
    must be able to tell a full ring from an empty one)."""
    v = _int(text)
    if v < 2 or v > 1 << 15 or v & (v - 1):
        raise argparse.ArgumentTypeError(f"must be a power of two between 2 and 32768, got {v}")
    return v


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line ("sigmatrace query: error: ...") plus where to look, exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class DefaultsFormatter(argparse.HelpFormatter):
    """Help that shows an option's default where it has a meaningful one (not None / False / [])."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "%(default)" in text or action.default in (None, False, [], argparse.SUPPRESS) or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"
