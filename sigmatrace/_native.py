"""Where the native half lives (the LD_PRELOAD tracer, test-only emulators, headers).

Search order:
  1. $SIGMATRACE_LIB_DIR                 (explicit override)
  2. <installed package>/_lib            (what `pip install .` puts there)
  3. <source checkout>/build/dev         (a developer's `cmake -S native -B build/dev`,
                                           newer than any installed copy when present)
  4. the installed distribution's _lib     (when tests import the source tree
                                           but `pip install .` built the native part)
"""
import json
import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
SOURCE_ROOT = PACKAGE_DIR.parent  # meaningful only when running from a checkout


def candidate_dirs():
    env = os.environ.get("SIGMATRACE_LIB_DIR")
    if env:
        yield Path(env)
    yield PACKAGE_DIR / "_lib"
    yield SOURCE_ROOT / "build" / "dev"
    installed = _installed_lib_dir()
    if installed is not None:
        yield installed


def _installed_lib_dir():
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        path = Path(distribution("sigmatrace").locate_file("sigmatrace/_lib"))
    except (ImportError, PackageNotFoundError, OSError):
        return None
    return path if path != PACKAGE_DIR / "_lib" else None


def lib_dir():
    """The first directory that holds libsigmatrace.so, or None."""
    for d in candidate_dirs():
        if (d / "libsigmatrace.so").is_file():
            return d
    return None


def find(name: str):
    """Path of a native file (library, emulator, helper binary) or None."""
    for d in candidate_dirs():
        for p in (d / name, d / "emu" / name, d / "tests" / name):
            if p.exists():
                return p
    return None


def tracer_library():
    d = lib_dir()
    return None if d is None else d / "libsigmatrace.so"


def include_dir():
    """Headers for compiling C clients: installed copy, else the checkout's."""
    for d in candidate_dirs():
        if (d / "include" / "sigmatrace" / "format.h").is_file():
            return d / "include"
    src = SOURCE_ROOT / "native" / "include"
    return src if (src / "sigmatrace" / "format.h").is_file() else None


def build_info():
    for d in candidate_dirs():
        p = d / "build_info.json"
        if p.is_file():
            try:
                return json.loads(p.read_text())
            except (OSError, ValueError):
                return None
    return None


def decode_library():
    """Path of the reader-side decode kernel (libsigmatrace_decode.so, see sigmatrace.decode.kernel) or None.

    Kept out of libsigmatrace.so, which is preloaded into traced programs."""
    for d in candidate_dirs():
        p = d / "libsigmatrace_decode.so"
        if p.is_file():
            return p
    return None
