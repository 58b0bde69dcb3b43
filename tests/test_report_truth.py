"""What the report tells a performance engineer (issue 17): latencies over measured values only, flows for
host-library operations, zero-filled bandwidth in GB/s, matrices and barrier figures readable at 128 ranks, a
latency figure for micro-benchmarks, and a terminal summary that names the straggler and the skew truthfully."""
from pathlib import Path

import numpy as np
import pytest

from sigmatrace.correlate import correlate
from sigmatrace.report import build_report

pytestmark = pytest.mark.sim
FIX = Path(__file__).resolve().parent.parent / "fixtures"


@pytest.fixture(scope="module")
def ar_report(tmp_path_factory):
    """The full-mode AllReduce: work requests with and without a recorded completion."""
    out = tmp_path_factory.mktemp("ar")
    corr, summary, _ = build_report(FIX / "allreduce_full.bin", out, workers=1, perfetto=False, quiet=True)
    return corr, summary, out


def test_wr_latency_counts_measured_latencies_only(ar_report):
    corr, s, _ = ar_report
    lat = np.asarray(corr.tables["ops"]["latency_ns"])
    known = lat[lat >= 0]
    assert 0 < len(known) < len(lat)
    w = s["wr_latency_ns"]
    assert w["count"] == len(known) and w["max"] == known.max()
    assert w["p50"] == pytest.approx(np.percentile(known, 50)) and w["mean"] == pytest.approx(known.mean())
