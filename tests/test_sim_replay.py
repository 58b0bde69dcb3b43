"""Replay (F14): invariants and what-if on captures from the model."""
import shutil

import numpy as np
import pytest

pytest.importorskip("simpy")
from sigmatrace.format import layout as L  # noqa: E402
from sigmatrace.format.reader import iter_chunks  # noqa: E402
from sigmatrace.format.writer import chunk_bytes  # noqa: E402
from sigmatrace.format import events as E  # noqa: E402
from sigmatrace_sim import run_workload  # noqa: E402
from sigmatrace_sim.replay import analyse, format_report  # noqa: E402

pytestmark = pytest.mark.sim


@pytest.fixture(scope="module")
def bfs(tmp_path_factory):
    out = tmp_path_factory.mktemp("bfs") / "bfs.bin"
    run_workload("bfs", str(out), scale=8, edgefactor=8, seed=3)
    return out


def test_clean_capture_passes(bfs):
    _, rep = analyse(bfs)
    assert rep["violations"] == []
    assert rep["recorded"]["predicted_lost_wqebb"] == 0 and rep["recorded"]["recorded_lost_wqebb"] == 0
    assert rep["clean"]
    assert "invariants:" in format_report(rep)


def test_injected_overwrite_is_flagged(bfs):
    # queue depth smaller than the WQEBBs in flight at the batch threshold
    _, rep = analyse(bfs, queue_depth=16, batch_threshold=128)
    assert rep["what_if"]["predicted_lost_wqebb"] > 0 and not rep["clean"]
    # and a threshold below the depth is safe again
    _, rep = analyse(bfs, queue_depth=1024, batch_threshold=32)
    assert rep["what_if"]["predicted_lost_wqebb"] == 0


def test_replay_agrees_with_model_losses(tmp_path):
    """A capture where the model really lost WQEs (threshold above the SQ depth): replay's
    prediction at the recorded settings finds losses too, and accounts for every WQEBB."""
    out = tmp_path / "lossy.bin"
    res = run_workload("stress", str(out), posts=300, seed=11, qp_depth=64, batch_threshold=128, hijack="recovery",
                       poller_wakeup_ns=300.0)
    assert res.meta["counts"]["wqes_lost"] > 0
    _, rep = analyse(out)
    assert rep["recorded"]["recorded_lost_wqebb"] > 0
    assert rep["recorded"]["predicted_lost_wqebb"] > 0
    assert not [v for v in rep["violations"] if v["kind"] != "pi_jump_exceeds_sq"]


def test_slower_poller_what_if_coalesces_and_delays(bfs):
    _, base = analyse(bfs)
    _, slow = analyse(bfs, poller_wakeup_ns=20000.0)
    assert slow["what_if"]["coalesced"] > base["what_if"]["coalesced"]
    assert slow["what_if"]["forward_delay_mean_ns"] > base["what_if"]["forward_delay_mean_ns"]


def _rewrite_first_doorbell_pi(src, dst, new_pi):
    """Copy a capture, changing the producer index of one DB_DOORBELL record mid-stream."""
    data = bytearray(open(src, "rb").read())
    done = False
    for ch in iter_chunks(str(src)):
        if done or ch.kind != L.CHUNK_EVENTS:
            continue
        ev = np.frombuffer(ch.payload, L.EVENT_DTYPE).copy()
        idx = np.flatnonzero(ev["type"] == E.value("DB_DOORBELL"))
        if len(idx) < 10:
            continue
        ev["aux"][idx[8]] = new_pi
        raw = int(ev["arg"][idx[8]]).to_bytes(8, "little")
        raw = raw[:1] + int(new_pi).to_bytes(2, "big") + raw[3:]
        ev["arg"][idx[8]] = int.from_bytes(raw, "little")
        new = chunk_bytes(ch.kind, ch.process_uid, ch.thread_index, ch.count, ev.tobytes())
        data[ch.offset:ch.offset + len(new)] = new
        done = True
    open(dst, "wb").write(bytes(data))
    return done


def test_non_monotonic_pi_is_flagged(bfs, tmp_path):
    bad = tmp_path / "bad.bin"
    assert _rewrite_first_doorbell_pi(bfs, bad, 0)
    _, rep = analyse(bad)
    kinds = {v["kind"] for v in rep["violations"]}
    assert "non_monotonic_pi" in kinds or "wqe_index_gap" in kinds
    assert not rep["clean"]


def test_cli_replay_and_sim(tmp_path, capsys):
    from sigmatrace.cli.main import main
    out = tmp_path / "p.bin"
    assert main(["sim", "put", "-o", str(out), "-p", "iters=10", "--seed", "2"]) == 0
    assert main(["replay", str(out), "--queue-depth", "4", "--batch-threshold", "8"]) == 0
    text = capsys.readouterr().out
    assert "what_if" in text and "decoded summary" in text
    assert main(["replay", str(out), "--strict"]) == 0
