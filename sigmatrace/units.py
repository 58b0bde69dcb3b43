"""Numbers as people read them in figures and on the terminal: bytes and durations with a unit chosen per
value and three significant digits.  Imports nothing of the package (every layer may use it)."""


def fmt_bytes(b):
    """Bytes with the unit picked per value, three significant digits: 512 B, 3.41 KB, 1.70 MB, 12.3 GB."""
    b = float(b)
    for u, s in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(b) >= s:
            v = b / s
            txt = f"{v:#.3g}".rstrip(".")                  # 3.00 MB, 28.7 KB, 123 KB
            return (txt if "e" not in txt else f"{v:.0f}") + f" {u}"
    return f"{int(b)} B"


def fmt_ns(ns, digits=3):
    """A duration with its unit and ``digits`` significant digits: 850 ns, 14.7 µs, 3.20 ms, 1.50 s."""
    ns = float(ns)
    for u, s in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(ns) >= s:
            return f"{ns / s:#.{digits}g}".rstrip(".") + f" {u}"
    return f"{ns:.0f} ns"
