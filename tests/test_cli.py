"""The `sigmatrace` command: help, version, doctor, clean errors."""
import json
import subprocess
import sys

import pytest

from sigmatrace.cli.main import SUBCOMMANDS

pytestmark = pytest.mark.sim


def sigmatrace(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "sigmatrace", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_help_lists_every_subcommand():
    r = sigmatrace("--help")
    assert r.returncode == 0
    for name in SUBCOMMANDS:
        assert name in r.stdout


def test_version():
    from sigmatrace import __version__

    r = sigmatrace("--version")
    assert r.returncode == 0 and __version__ in r.stdout


def test_every_subcommand_has_help():
    for name in SUBCOMMANDS:
        r = sigmatrace(name, "--help")
        assert r.returncode == 0, (name, r.stderr)
        assert "Traceback" not in r.stderr


def test_wrong_flag_is_a_usage_error_not_a_traceback():
    r = sigmatrace("doctor", "--no-such-flag")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and "unrecognized arguments" in r.stderr


def test_doctor_reports_build_and_machine():
    r = sigmatrace("doctor", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    for key in ("tracer_library", "build", "libraries", "cpu", "gpus", "rdma_devices"):
        assert key in info
    assert info["cpu"]["doorbell_wait"] in ("umonitor/umwait", "monitorx/mwaitx",
                                           "spin with pause and bounded back-off")
    text = sigmatrace("doctor")
    assert text.returncode == 0 and "doorbell poller" in text.stdout


def test_doctor_reports_hijack_build_and_poller_settings():
    import os
    env = dict(os.environ, SIGMATRACE_POLLER_CPUS="0,0-1", SIGMATRACE_POLLER_SPIN_US="-1")
    r = subprocess.run([sys.executable, "-m", "sigmatrace", "doctor"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "GPU hijack" in r.stdout
    assert "SIGMATRACE_POLLER_SPIN_US=-1 -> spin forever" in r.stdout
    assert "SIGMATRACE_POLLER_CPUS=0,0-1 -> pollers pinned round-robin to cpu 0,0,1" in r.stdout
    j = json.loads(subprocess.run([sys.executable, "-m", "sigmatrace", "doctor", "--json"], capture_output=True,
                                  text=True, env=env, timeout=120).stdout)
    h = j["hijack"]
    assert h["cuda_provider"] == ("cuda" in (j["build"] or {}).get("providers", []))
    assert h["poller_cpus"] == [0, 0, 1] and h["spin_us"] == -1


def test_doctor_says_what_to_do_about_each_missing_piece():
    from sigmatrace.cli import doctor
    info = doctor.collect()
    info.update(tracer_library="/x/libsigmatrace.so", build={"providers": ["cuda", "ibv"]}, emulated_hca=None,
                rdma_devices=[], gpus=[], ptp_clocks=[], trace_processor=None,
                cpu=dict(info["cpu"], waitpkg=False, monitorx=False))
    got = dict(doctor.advice(info))
    # every provider is built everywhere: one missing is an older build, and no -dev package is the answer
    assert "rebuild" in got["ucx provider"] and "rebuild" in got["ofi provider"]
    assert "-dev" not in got["ucx provider"] + got["ofi provider"]
    assert "mlx5 provider" in got and "ibv provider" not in got
    assert "LD_LIBRARY_PATH" in got["RDMA devices"]
    assert "SIGMATRACE_TRACE_PROCESSOR" in got["trace_processor"]
    assert "SIGMATRACE_POLLER_CPUS" in got["poller wait"]
    info.update(tracer_library=None)
    assert ".ci/install" in dict(doctor.advice(info))["tracer library"]
