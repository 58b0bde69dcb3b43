"""Bounded-memory report path: tiny batches, file ranges decoded in parallel, streamed events table
and Perfetto host slices give exactly the outputs of the default (large-batch, one range per file) path."""
import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sigmatrace.report import build_report
from sigmatrace.correlate import correlate
from sigmatrace.correlate import pool as core
from sigmatrace_sim.synthetic import write_synthetic

pytestmark = pytest.mark.sim
FIX = Path(__file__).resolve().parent.parent / "fixtures"


def _norm(v):
    return "nan" if isinstance(v, float) and math.isnan(v) else v


def _read(p):
    """A table file, or a directory of part files read in part order (the events table)."""
    if p.is_dir():
        parts = sorted(p.glob("*.parquet"))
        assert parts, p
        return pa.concat_tables([pq.read_table(f) for f in parts])
    return pq.read_table(p)


def _same_report(a, b):
    names = sorted(f.name for f in (a / "tables").iterdir())
    assert names == sorted(f.name for f in (b / "tables").iterdir())
    assert "events" in names
    for name in names:
        f = a / "tables" / name
        ta, tb = _read(f), _read(b / "tables" / name)
        assert ta.schema == tb.schema, f.name
        for c in ta.column_names:
            x, y = ta[c], tb[c]
            if pa.types.is_dictionary(x.type):
                x, y = x.cast(pa.string()), y.cast(pa.string())
            assert [_norm(v) for v in x.to_pylist()] == [_norm(v) for v in y.to_pylist()], (f.name, c)
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    sa.pop("timings_s"), sb.pop("timings_s")
    assert sa == sb
    assert (a / "trace.pftrace").read_bytes() == (b / "trace.pftrace").read_bytes()


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    d, _ = write_synthetic(tmp_path_factory.mktemp("syn"), seed=7)
    one, _ = write_synthetic(tmp_path_factory.mktemp("one"), seed=8, single_file=True)
    caps = {"dir": Path(d), "single": Path(one)}
    if (FIX / "bfs.bin").exists():
        caps["bfs"] = FIX / "bfs.bin"
    return caps


@pytest.mark.parametrize("which", ["dir", "single", "bfs"])
def test_tiny_batches_and_ranges_equal_default(captures, tmp_path, monkeypatch, which):
    if which not in captures:
        pytest.skip("model fixture not present")
    cap = captures[which]
    ref = tmp_path / "ref"
    build_report(cap, ref, workers=1, figures=False, quiet=True, max_perfetto_events=300)
    monkeypatch.setattr(core, "SPLIT_MIN_BYTES", 0)     # split single files into ranges across workers
    from sigmatrace.tables import parquet as export_tables
    monkeypatch.setattr(export_tables, "ROW_RANGE", 50)  # per-operation tables in many row ranges, written by
    # forked workers alongside the events parts
    small = tmp_path / "small"
    build_report(cap, small, workers=3, figures=False, quiet=True, max_perfetto_events=300, batch_records=7)
    _same_report(ref, small)
    # the streamed events table came in more, smaller row groups (bounded batches: whole chunks of <= 7 records
    # unless one chunk is larger)
    rg = lambda d: sum(pq.ParquetFile(f).num_row_groups for f in (d / "tables" / "events").glob("*.parquet"))
    assert rg(small) > rg(ref)
    # 3 workers wrote the events table as several parts (in parallel); 1 worker as one
    parts = lambda d, t="events": len(list((d / "tables" / t).glob("part-*.parquet")))
    assert parts(ref) == 1 and parts(small) > 1
    # the per-operation tables too: one part with 1 worker, contiguous row ranges written in parallel with 3
    for t in ("ops", "completions", "flows"):
        rows = _read(ref / "tables" / t).num_rows
        assert parts(ref, t) == 1 and parts(small, t) == max(1, min(3, -(-rows // 50))), t


def test_events_not_held_in_memory(captures):
    c = correlate(captures["dir"], workers=1, batch_records=5)
    assert not c.events_loaded                      # nothing decoded beyond the correlator's records
    n = c.stats["events"]
    got = sum(len(b["tsc"]) for b in c.iter_events())
    biggest = max(int(p.chunks["events"].max()) for p in c.procs if len(p.chunks))
    assert got == n and all(len(b["tsc"]) <= max(5, biggest) for b in c.iter_events())   # whole chunks
    ev = c.tables["events"]                          # loads on first access, same rows
    assert len(ev["ns"]) == n and c.events_loaded
    assert c.stats["time_range_ns"] == [int(ev["ns"].min()), int(ev["ns"].max())]
    assert np.all(np.diff(ev["process"]) >= 0)
