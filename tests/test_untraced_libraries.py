"""A traced program that loads a library whose provider is disabled or missing is never silent about it
(issue 17, F27): the process file's header lists the library (``untraced_libraries``, docs/format.md),
`sigmatrace run` prints one line naming it and what to do (the tracer writes it, once per library, in
rank 0 or an unranked process), and `sigmatrace report` prints one line per library.
"""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from native_util import serve_and_connect
from sigmatrace import _native
from sigmatrace.format import TraceWriter, layout as L
from sigmatrace.format import events as E
from sigmatrace.format import read_capture

pytestmark = pytest.mark.sim

LIB = _native.tracer_library()
FI_PINGPONG = shutil.which("fi_pingpong")
needs_tracer = pytest.mark.skipif(LIB is None, reason="libsigmatrace.so not built (cmake --build build/dev)")
needs_fi = pytest.mark.skipif(FI_PINGPONG is None, reason="fi_pingpong (libfabric-bin) not installed")
ENV = dict(os.environ, PYTHONPATH=str(_native.SOURCE_ROOT))
ENV.pop("LD_PRELOAD", None)


def _run(out, providers, argv):
    return [sys.executable, "-m", "sigmatrace", "run", "-o", str(out), "--providers", providers, "--", *argv]


def _pingpong(tmp_path, providers, rank_env=({}, {})):
    """fi_pingpong over tcp, both sides under `sigmatrace run --providers ...` (rank variables per side through
    env(1)); returns (trace dir, server stdout+stderr, client stdout+stderr)."""
    out = tmp_path / f"trace-{providers}"
    common = ["-p", "tcp", "-e", "msg", "-I", "10", "-S", "100"]

    def side(i, argv):
        return ["env", *[f"{k}={v}" for k, v in rank_env[i].items()], *_run(out, providers, argv)]
    srv, cli = serve_and_connect(lambda port: side(0, [FI_PINGPONG, *common, "-B", str(port)]),
                                 lambda port: side(1, [FI_PINGPONG, *common, "-P", str(port), "127.0.0.1"]),
                                 ENV, settle=1.0)
    assert srv[0] == 0 and cli[0] == 0, srv[1] + cli[1]
    return out, srv[1], cli[1]


def _notices(text, lib="libfabric.so.1"):
    return [ln for ln in text.splitlines() if f"{lib} is loaded but" in ln]


def _all_notices(text):
    return [ln for ln in text.splitlines() if ln.startswith("sigmatrace: ") and " is loaded but " in ln]


@needs_tracer
@needs_fi
@pytest.mark.parametrize("providers", ["ibv,ucx", "none"])
def test_run_says_which_library_it_does_not_trace(tmp_path, providers):
    """libfabric loaded with the ofi provider left out: one line on each side's stderr naming libfabric and
    how to trace it, a process file per side (also with --providers none, where nothing else is recorded)
    whose header lists libfabric, and no libfabric records."""
    out, srv, cli = _pingpong(tmp_path, providers)
    for text in (srv, cli):
        lines = _notices(text)
        assert len(lines) == 1, text
        assert "ofi provider is disabled" in lines[0] and "add ofi to --providers" in lines[0], lines[0]
        assert f"(--providers {providers})" in lines[0], lines[0]
    cap = read_capture(out)
    assert len(cap.processes) == 2
    for p in cap.processes:
        assert p.complete
        libs = {x["library"]: x for x in p.untraced_libraries}
        assert libs["libfabric.so.1"]["provider"] == "ofi" and libs["libfabric.so.1"]["reason"] == L.UNTRACED_DISABLED
        assert libs["libfabric.so.1"]["path"].endswith("libfabric.so.1")
    assert not np.any((cap.events["type"] >> 8) == E.LAYER_OFI)
    (entry,) = [e for e in cap.untraced_libraries() if e["library"] == "libfabric.so.1"]
    assert sorted(entry["processes"]) == [0, 1]

    r = subprocess.run([sys.executable, "-m", "sigmatrace", "report", str(out), "-o", str(tmp_path / "rep")],
                       capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if "libfabric.so.1" in ln]
    assert len(lines) == 1, r.stdout
    assert "loaded by 2 processes" in lines[0] and "trace again with ofi in --providers" in lines[0], lines[0]
    # quiet: the summary goes, the notice does not (stderr)
    r = subprocess.run([sys.executable, "-m", "sigmatrace", "report", str(out), "-o", str(tmp_path / "rep"), "-q"],
                       capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0 and r.stdout == ""
    assert [ln for ln in r.stderr.splitlines() if "libfabric.so.1" in ln], r.stderr


@needs_tracer
@needs_fi
def test_enabled_provider_is_not_listed(tmp_path):
    """ofi on: libfabric is traced and neither listed nor named on stderr (libfabric's verbs provider may
    bring libibverbs, which is, the ibv provider being off)."""
    out, srv, cli = _pingpong(tmp_path, "ofi")
    assert not _notices(srv) and not _notices(cli)
    cap = read_capture(out)
    for p in cap.processes:
        assert "libfabric.so.1" not in {x["library"] for x in p.untraced_libraries}
        assert {x["provider"] for x in p.untraced_libraries} <= {"ibv", "mlx5"}
    assert np.any((cap.events["type"] >> 8) == E.LAYER_OFI)
    out, srv, cli = _pingpong(tmp_path, "all")
    assert not _all_notices(srv) and not _all_notices(cli)
    assert all(p.untraced_libraries == [] for p in read_capture(out).processes)


@needs_tracer
@needs_fi
def test_only_rank_zero_prints_but_every_rank_records(tmp_path):
    out, srv, cli = _pingpong(tmp_path, "ibv", ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"},
                                                 {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}))
    assert len(_notices(srv)) == 1 and not _notices(cli), (srv, cli)
    cap = read_capture(out)
    assert sorted(p.rank for p in cap.processes) == [0, 1]
    assert all("libfabric.so.1" in {x["library"] for x in p.untraced_libraries} for p in cap.processes)


@needs_tracer
def test_a_library_dlopened_late_and_never_called_is_recorded_at_exit(tmp_path):
    """Python dlopen's libfabric after start and calls nothing through a shim: the exit path still finds it,
    and makes the file exist to say so."""
    if shutil.which("fi_info") is None:
        pytest.skip("libfabric not installed")
    out = tmp_path / "late"
    code = "import ctypes; ctypes.CDLL('libfabric.so.1'); print('ok')"
    r = subprocess.run(_run(out, "ibv", [sys.executable, "-c", code]), capture_output=True, text=True, env=ENV,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    assert len(_notices(r.stderr)) == 1, r.stderr
    (p,) = read_capture(out).processes
    assert "libfabric.so.1" in [x["library"] for x in p.untraced_libraries]


@needs_tracer
def test_untraced_program_output_is_unchanged_but_for_the_notice(tmp_path):
    """The tracer changes nothing else: stdout and exit status are the program's own."""
    if shutil.which("fi_info") is None:
        pytest.skip("libfabric not installed")
    code = "import ctypes, sys; ctypes.CDLL('libfabric.so.1'); print('out'); sys.exit(3)"
    base = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=60)
    tr = subprocess.run(_run(tmp_path / "t", "none", [sys.executable, "-c", code]), capture_output=True, text=True,
                        env=ENV, timeout=60)
    assert (tr.returncode, tr.stdout) == (base.returncode, base.stdout) == (3, "out\n")
    new = [ln for ln in tr.stderr.splitlines() if ln not in base.stderr.splitlines()]
    assert new == _all_notices(tr.stderr) and _notices(tr.stderr), tr.stderr


def test_report_says_what_to_do_for_a_provider_not_built(tmp_path):
    """The reader and the report understand both reasons; a library whose provider this build lacks asks for a
    rebuild (a capture written with the format's Python writer)."""
    path = tmp_path / "cap.bin"
    untraced = [{"library": "libucp.so.0", "path": "/usr/lib/libucp.so.0", "provider": "ucx",
                 "reason": L.UNTRACED_NOT_BUILT},
                {"library": "libnccl.so.2", "path": "/opt/libnccl.so.2", "provider": "nccl",
                 "reason": L.UNTRACED_DISABLED}]
    for uid in (0x11, 0x22):
        with open(path, "ab") as f, TraceWriter(f, uid) as w:
            w.process({"format_version": 1, "host": "h", "pid": uid, "rank": uid // 0x11 - 1, "mode": "simple",
                       "providers": ["ibv", "cuda"], "tsc_hz": 1e9, "nics": [], "gpus": [],
                       L.HEADER_UNTRACED_LIBRARIES: untraced if uid == 0x11 else untraced[:1]})
            w.thread(1, tid=uid, name="main", role="app")
            w.events(1, np.zeros(1, L.EVENT_DTYPE))
            w.end({"reason": "exit", "events": 1, "dropped_events": 0})
    cap = read_capture(path)
    got = {e["library"]: e for e in cap.untraced_libraries()}
    assert got["libucp.so.0"]["processes"] == [0, 1] and got["libnccl.so.2"]["processes"] == [0]
    r = subprocess.run([sys.executable, "-m", "sigmatrace", "report", str(path), "-o", str(tmp_path / "rep"),
                        "--no-perfetto", "--no-figures"], capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr
    ucx = [ln for ln in r.stdout.splitlines() if "libucp.so.0" in ln]
    nccl = [ln for ln in r.stdout.splitlines() if "libnccl.so.2" in ln]
    assert len(ucx) == 1 and "built without the ucx provider" in ucx[0] and "rebuild the tracer" in ucx[0]
    assert "loaded by 2 processes" in ucx[0]
    assert len(nccl) == 1 and "--providers ibv,cuda" in nccl[0] and "loaded by 1 process " in nccl[0]
    import json
    s = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert [e["library"] for e in s["untraced_libraries"]] == ["libucp.so.0", "libnccl.so.2"]
