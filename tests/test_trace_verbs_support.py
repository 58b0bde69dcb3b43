"""Helpers of the traced-verbs tests (tests/test_trace_verbs_*.py); no tests here.

Programs run on the emulated HCA (native/emu, selected with LD_LIBRARY_PATH)
with the tracer preloaded through `sigmatrace run`'s own environment builder,
each test on its own emulated fabric and TCP port.  The emulated-HCA basics
(needs_emu, the `fabric` fixture, ports, process cleanup) are in
tests/native_util.py and tests/conftest.py.
"""
import argparse
import subprocess

import numpy as np
import pytest

from native_util import emu_env, free_port, popen, reaped, wait_listen
from sigmatrace import _native
from sigmatrace.format import read_capture

TRACER = _native.tracer_library()
IBGDA_CLIENT = _native.find("emu_ibgda_client")
RC_PINGPONG = "/usr/bin/ibv_rc_pingpong"


def _tracer_build_info():
    """build_info.json next to the tracer that will be preloaded (not the first one found)."""
    import json
    try:
        return json.loads((TRACER.parent / "build_info.json").read_text()) if TRACER else {}
    except (OSError, ValueError):
        return {}


_info = _tracer_build_info()
needs_tracer = pytest.mark.skipif(
    TRACER is None or "ibv" not in (_info.get("providers") or []),
    reason="libsigmatrace.so with the ibv provider not built (cmake --build build/dev; needs infiniband/verbs.h)",
)
needs_mlx5_provider = pytest.mark.skipif(
    "mlx5" not in (_info.get("providers") or []), reason="tracer built without the mlx5 provider (no mlx5dv.h)")


def env_for(fabric, lid, out=None, mode="full", **extra):
    """Environment of one emulated node; traced when `out` is a directory."""
    env = emu_env(fabric, lid)
    if out is not None:
        try:
            from sigmatrace.cli.run import build_env
            args = argparse.Namespace(output=str(out), mode=mode, providers=None, buffer_kb=None, eager=False)
            env = build_env(args, env)
        except ImportError:  # before `sigmatrace run` existed: the same variables by hand
            env["LD_PRELOAD"] = str(TRACER)
            env["SIGMATRACE_OUTPUT_DIR"] = str(out)
            env["SIGMATRACE_MODE"] = mode
        # exact counts below: a full buffer waits for the writer instead of dropping
        env["SIGMATRACE_DROP_POLICY"] = "block"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_pair(argv, fabric, out=None, mode="full", timeout=25.0, lids=(0x11, 0x12)):
    """Server and client of a socket-bootstrapped rdma-core program (pingpong,
    perftest) on two emulated nodes.  Returns (server stdout, client stdout)."""
    port = str(free_port())
    argv = list(argv) + ["-p", port]
    srv = popen(argv, env_for(fabric, lids[0], out, mode))
    with reaped(srv):
        wait_listen(int(port), srv)
        cli = subprocess.run(argv + ["localhost"], env=env_for(fabric, lids[1], out, mode), capture_output=True,
                             text=True, timeout=timeout)
        so, se = srv.communicate(timeout=timeout)
    assert cli.returncode == 0, f"client rc={cli.returncode}\n{cli.stdout}\n{cli.stderr}"
    assert srv.returncode == 0, f"server rc={srv.returncode}\n{so}\n{se}"
    return so, cli.stdout


def capture(out):
    cap = read_capture(out)
    assert cap.dropped_events() == 0 and cap.lost_bytes == 0, cap.summary()
    assert not cap.summary()["incomplete_processes"], cap.summary()
    return cap


def per_process(table, proc, cond=None):
    sel = table["process"] == proc
    if cond is not None:
        sel &= cond
    return int(np.count_nonzero(sel))


def pingpong_recvs_posted(iters, rx_depth):
    """Receives ibv_rc_pingpong posts: rx_depth up front, then whenever only
    one is left outstanding after a receive completion, a refill back to
    rx_depth (libibverbs/examples/rc_pingpong.c, parse_single_wc)."""
    routs = posted = rx_depth
    for _ in range(iters):
        routs -= 1
        if routs <= 1:
            posted += rx_depth - routs
            routs = rx_depth
    return posted
