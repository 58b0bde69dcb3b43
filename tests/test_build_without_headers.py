"""The tracer builds every provider without third-party development headers, and that build traces real
programs exactly as the normal one does (issue 17, F27).

The tracer alone (target sigmatrace) is configured and built in a throwaway directory with an include
directory in front of the system's that poisons every third-party header the providers could reach
(rdma-core's verbs/mlx5dv, libfabric's, UCX's, CUDA's, NCCL's: each one an #error).  A single include of
any of them fails the build; the compiler's dependency files are checked as well.  Then ibv_rc_pingpong on
the emulated HCA (ibv provider), fi_pingpong over tcp (ofi) and ucx_perftest over tcp (ucx) run once with
each tracer: the records are the same.  (The emulated HCA itself is test-only and still needs rdma-core's
headers: the poisoned configuration skips it, and build_info.json says so.)
"""
import json
import os
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from native_util import needs_bin, needs_emu, serve_and_connect
from sigmatrace import _native
from sigmatrace.format import events as E
from sigmatrace.format import read_capture
from test_trace_verbs_support import RC_PINGPONG, run_pair

pytestmark = pytest.mark.sim

ROOT = Path(__file__).resolve().parents[1]
CMAKE = shutil.which("cmake")
FI_PINGPONG = shutil.which("fi_pingpong")
PERFTEST = shutil.which("ucx_perftest")
NORMAL = _native.lib_dir()

POISONED = ["infiniband/verbs.h", "infiniband/mlx5dv.h", "infiniband/verbs_api.h", "infiniband/ib_user_ioctl_verbs.h",
            "rdma/fabric.h", "rdma/fi_domain.h", "rdma/fi_endpoint.h", "rdma/fi_cm.h", "rdma/fi_eq.h",
            "rdma/fi_rma.h", "rdma/fi_tagged.h", "rdma/fi_atomic.h", "rdma/fi_errno.h",
            "ucp/api/ucp.h", "ucp/api/ucp_def.h", "ucs/type/status.h", "uct/api/uct.h",
            "cuda.h", "cuda_runtime.h", "nccl.h"]
# where the real ones live: no dependency of the tracer's objects may point there
THIRD_PARTY = ("/infiniband/", "/rdma/", "/ucp/", "/ucs/", "/uct/", "/cuda.h", "/cuda_runtime.h", "/nccl.h",
               "/cuda/include/")


@pytest.fixture(scope="module")
def headerless(tmp_path_factory):
    """The directory of a libsigmatrace.so built with the third-party headers poisoned."""
    if CMAKE is None:
        pytest.skip("needs cmake")
    d = tmp_path_factory.mktemp("headerless")
    poison = d / "poison"
    for h in POISONED:
        (poison / h).parent.mkdir(parents=True, exist_ok=True)
        (poison / h).write_text(f'#error "the tracer included the third-party header <{h}>"\n')
    build = d / "build"
    r = subprocess.run(["nice", CMAKE, "-S", str(ROOT / "native"), "-B", str(build), "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                        f"-DCMAKE_C_FLAGS=-I{poison}"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    r = subprocess.run(["nice", CMAKE, "--build", str(build), "--target", "sigmatrace", "-j2"], capture_output=True,
                       text=True, timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "warning:" not in out, out[-4000:]
    return build


def test_every_provider_builds_without_third_party_headers(headerless):
    assert (headerless / "libsigmatrace.so").is_file()
    # the compiler's own record of what each object read: no third-party header
    deps = list(headerless.rglob("*.o.d"))
    assert len(deps) >= 20, sorted(p.name for p in deps)
    read = {ln.strip(" \\\n") for p in deps for ln in p.read_text().split() if ln.endswith(".h")}
    assert any("abi/verbs.h" in h for h in read) and any("abi/fabric.h" in h for h in read), sorted(read)[:20]
    bad = sorted(h for h in read if any(t in h for t in THIRD_PARTY) and not h.startswith(str(ROOT / "native")))
    assert not bad, bad
    info = json.loads((headerless / "build_info.json").read_text())
    assert sorted(info["providers"]) == ["cuda", "ibv", "mlx5", "nccl", "ofi", "ucx"]
    # truthful: the poisoned rdma-core headers did not compile, so no emulator was configured
    assert info["system_headers"]["verbs"] == 0 and info["emulated_hca"] is False
    assert "rdma-core" in info["declarations"]["ibv"] and "abi/verbs.h" in info["declarations"]["ibv"]


def _records(out):
    """Per role (client/server, from argv): Counter of the provider records' types, and each type's sorted
    byte counts where it has them (times, pointers and ids differ between runs; these may not)."""
    cap = read_capture(out)
    assert cap.losses == [] and cap.dropped_events() == 0, cap.summary()
    roles = {}
    for p in cap.processes:
        role = "client" if {"localhost", "127.0.0.1"} & set(p.header["argv"]) else "server"
        sel = (cap.event_process == p.index) & (cap.events["type"] >> 8 != E.LAYER_TRACE)
        types = Counter(E.name_of(t) for t in cap.events["type"][sel])
        sizes = {}
        for name in types:
            t = cap.table(name)
            if "bytes" in t:
                sizes[name] = sorted(t["bytes"][t["process"] == p.index].tolist())
        roles[role] = (types, sizes)
    assert sorted(roles) == ["client", "server"], roles.keys()
    return roles


def _same_records(normal, headerless_out, layer):
    a, b = _records(normal), _records(headerless_out)
    for role in ("client", "server"):
        assert any(E.BY_NAME[n].layer == layer for n in a[role][0]), f"{role}: nothing of layer {layer} traced"
    assert a == b


@needs_emu
@needs_bin(RC_PINGPONG)
def test_headerless_tracer_traces_ibv_rc_pingpong_as_the_normal_one(headerless, tmp_path, fabric, monkeypatch):
    outs = []
    for lib_dir in (NORMAL, headerless):
        monkeypatch.setenv("SIGMATRACE_LIB_DIR", str(lib_dir))
        out = tmp_path / f"trace-{len(outs)}"
        run_pair([RC_PINGPONG, "-s", "512", "-n", "50"], fabric, out, "simple")
        outs.append(out)
    _same_records(*outs, E.LAYER_IBV)


def _serve(cmd_srv, cmd_cli, out, lib_dir, extra=None):
    env = dict(os.environ, LD_PRELOAD=str(Path(lib_dir) / "libsigmatrace.so"), SIGMATRACE_OUTPUT_DIR=str(out),
               SIGMATRACE_MODE="simple", SIGMATRACE_DROP_POLICY="block", **(extra or {}))
    (rs, so), (rc, co) = serve_and_connect(cmd_srv, cmd_cli, env, settle=0.4)
    assert rs == 0 and rc == 0, so + co


@pytest.mark.skipif(FI_PINGPONG is None, reason="fi_pingpong (libfabric-bin) not installed")
def test_headerless_tracer_traces_fi_pingpong_as_the_normal_one(headerless, tmp_path):
    common = ["-p", "tcp", "-e", "msg", "-I", "30", "-S", "700"]
    outs = []
    for lib_dir in (NORMAL, headerless):
        out = tmp_path / f"trace-{len(outs)}"
        _serve(lambda port: [FI_PINGPONG, *common, "-B", str(port)],
               lambda port: [FI_PINGPONG, *common, "-P", str(port), "127.0.0.1"], out, lib_dir)
        outs.append(out)
    _same_records(*outs, E.LAYER_OFI)


@pytest.mark.skipif(PERFTEST is None, reason="ucx_perftest (ucx-utils) not installed")
def test_headerless_tracer_traces_ucx_perftest_as_the_normal_one(headerless, tmp_path):
    outs = []
    for lib_dir in (NORMAL, headerless):
        out = tmp_path / f"trace-{len(outs)}"
        _serve(lambda port: [PERFTEST, "-p", str(port)],
               lambda port: [PERFTEST, "-p", str(port), "-t", "tag_bw", "-n", "100", "-s", "300", "-w", "0",
                             "127.0.0.1"], out, lib_dir, dict(UCX_TLS="tcp", UCX_WARN_UNUSED_ENV_VARS="n"))
        outs.append(out)
    _same_records(*outs, E.LAYER_UCX)
    assert np.all(np.asarray(_records(outs[1])["client"][1]["UCP_TAG_SEND"]) == 300)
