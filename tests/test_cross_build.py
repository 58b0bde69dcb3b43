"""The native tree builds for aarch64 (Grace Hopper is a primary IBGDA platform): the tracer, the decode
kernel, the emulated HCA and the test clients, with Debian's cross compiler; hijack/arch.h has its barriers
for that architecture (an unknown one stops the build).  The recorder's bytes on aarch64 are checked under
qemu in tests/test_format_conformance.py."""
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.sim

ROOT = Path(__file__).resolve().parents[1]
CROSS_CC = shutil.which("aarch64-linux-gnu-gcc")
CMAKE = shutil.which("cmake")


def _machine(path):
    head = Path(path).read_bytes()[:20]
    assert head[:4] == b"\x7fELF", path
    return int.from_bytes(head[18:20], "little")      # e_machine


@pytest.mark.skipif(CROSS_CC is None or CMAKE is None, reason="needs cmake and aarch64-linux-gnu-gcc")
def test_native_tree_cross_compiles_for_aarch64():
    build = ROOT / "build" / "cross-aarch64"
    r = subprocess.run([CMAKE, "-S", str(ROOT / "native"), "-B", str(build), f"-DCMAKE_C_COMPILER={CROSS_CC}",
                        "-DCMAKE_SYSTEM_NAME=Linux", "-DCMAKE_SYSTEM_PROCESSOR=aarch64",
                        "-DCMAKE_BUILD_TYPE=RelWithDebInfo"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([CMAKE, "--build", str(build), "-j2"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "warning:" not in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]
    EM_AARCH64 = 183
    assert _machine(build / "libsigmatrace.so") == EM_AARCH64
    for emu in ("libibverbs.so.1", "libmlx5.so.1"):
        if (build / "emu" / emu).exists():
            assert _machine(build / "emu" / emu) == EM_AARCH64


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_unknown_architecture_stops_the_build(tmp_path):
    src = tmp_path / "t.c"
    src.write_text('#include "hijack/arch.h"\nint main(void) { return 0; }\n')
    # preprocess only, with empty stand-ins for the system headers (glibc's own refuse a host compiler
    # without __x86_64__): each missing one is added until the preprocessor gets through the includes
    import re
    for _ in range(100):
        r = subprocess.run(["gcc", "-E", "-nostdinc", f"-I{tmp_path}", "-U__x86_64__", "-U__aarch64__",
                            f"-I{ROOT / 'native' / 'src'}", f"-I{ROOT / 'native' / 'include'}", str(src)],
                           capture_output=True, text=True)
        m = re.search(r"fatal error: ([\w./]+): No such file", r.stderr)
        if not m:
            break
        stand_in = tmp_path / m.group(1)
        stand_in.parent.mkdir(parents=True, exist_ok=True)
        stand_in.write_text("")
    assert r.returncode != 0 and "no barriers for this architecture" in r.stderr
