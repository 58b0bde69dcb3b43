"""Format benchmarks: hot-record decode throughput and bytes per record on disk.

Goal (issue 2): >= 20 million records per second on one core.  The ratio
reported is decode throughput relative to a plain memory copy of the same
bytes measured in the same run (the floor any decoder pays).
"""
import io

import numpy as np
import pytest

from sigmatrace.format import EVENT_DTYPE, TraceWriter, read_capture
from sigmatrace.format import events as E

pytestmark = pytest.mark.sim

N = 4_000_000


@pytest.fixture(scope="module")
def capture_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("fmt") / "bench.trace"
    ev = np.zeros(N, EVENT_DTYPE)
    ev["tsc"] = np.arange(N, dtype=np.uint64) * 37
    ev["type"] = E.value("DB_DOORBELL")
    ev["aux"] = np.arange(N) & 0xFFFF
    ev["obj"] = 0x1234
    ev["arg"] = np.arange(N, dtype=np.uint64)
    with open(path, "wb") as f:
        w = TraceWriter(f, process_uid=1)
        w.process({"format_version": 1, "host": "bench"})
        w.thread(1, tid=1, name="poller")
        w.events(1, ev)
        w.end({"reason": "exit"})
    return path


def test_decode_throughput(benchmark, capture_file):
    raw = capture_file.read_bytes()
    cap = benchmark.pedantic(read_capture, args=(capture_file,), rounds=7, iterations=1, warmup_rounds=1)
    assert len(cap.events) == N
    median = benchmark.stats.stats.median
    import time

    copies = []
    for _ in range(7):
        t = time.perf_counter()
        np.frombuffer(raw, np.uint8).copy()
        copies.append(time.perf_counter() - t)
    copy_median = float(np.median(copies))
    rate = N / median
    benchmark.extra_info.update(
        records=N,
        records_per_second=rate,
        bytes_per_record=len(raw) / N,
        decode_vs_memcpy=median / copy_median,
    )
    print(f"\ndecode: {rate / 1e6:.1f} M records/s (median of 7), {len(raw) / N:.2f} bytes/record on disk, "
          f"{median / copy_median:.2f}x the time of a plain copy of the file bytes")


def test_bytes_per_record_simple_mode_stream(benchmark):
    """Bytes on disk per event for a simple-mode doorbell stream (chunk headers included)."""
    ev = np.zeros(100_000, EVENT_DTYPE)
    ev["type"] = E.value("DB_DOORBELL")

    def write():
        buf = io.BytesIO()
        TraceWriter(buf, process_uid=2).events(1, ev)
        return len(buf.getvalue())

    size = benchmark(write)
    benchmark.extra_info["bytes_per_event"] = size / len(ev)
    assert size / len(ev) < 24.1
