"""Parquet layout of the report tables: part directories, encodings, and the normalised flows table.

The per-record tables are directories of parts; time columns and sequential ids are DELTA_BINARY_PACKED,
the rest LZ4 (readable by any Parquet reader: DuckDB reads them back); a flow carries only its own facts and
joins ops (and completions) for the rest.
"""
from pathlib import Path

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest

from sigmatrace.correlate import correlate
from sigmatrace.tables import write_tables

pytestmark = pytest.mark.sim
FIX = Path(__file__).resolve().parent.parent / "fixtures"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    cap = FIX / "allreduce_full.bin"
    if not cap.exists():
        pytest.skip("model fixture allreduce_full.bin not present (fixtures/make_fixtures.py)")
    c = correlate(cap, workers=1)
    out = tmp_path_factory.mktemp("tables")
    return c, out, write_tables(c, out, workers=1)


def _encodings(path, column):
    pf = pq.ParquetFile(path)
    i = pf.schema_arrow.get_field_index(column)
    md = pf.metadata.row_group(0).column(i)
    return set(md.encodings), md.compression


def test_record_tables_are_part_directories(report):
    c, out, written = report
    for name in ("events", "ops", "completions", "flows"):
        d = Path(written[name])
        assert d.is_dir() and [p.name for p in d.iterdir()] == ["part-00000.parquet"], name
        assert not (out / f"{name}.parquet").exists()
    assert (out / "qps.parquet").is_file()


def test_column_encodings(report):
    _, out, _ = report
    ops = out / "ops" / "part-00000.parquet"
    for col in ("ns", "tsc", "op_id", "complete_ns"):
        enc, comp = _encodings(ops, col)
        assert "DELTA_BINARY_PACKED" in enc and comp == "UNCOMPRESSED", col
    for col in ("raddr", "wr_id", "bytes", "qp_id"):
        enc, comp = _encodings(ops, col)
        assert "DELTA_BINARY_PACKED" not in enc and comp == "LZ4", col
    enc, comp = _encodings(out / "events" / "part-00000.parquet", "ns")
    assert "DELTA_BINARY_PACKED" in enc
    # every column reads back in DuckDB (no encoding a common reader rejects)
    n = duckdb.sql(f"select count(*), sum(bytes), min(ns) from read_parquet('{out}/ops/*.parquet')").fetchall()[0]
    assert n[0] == pq.read_table(out / "ops").num_rows and n[1] > 0 and n[2] > 0


def test_flows_join_ops_and_completions(report):
    c, out, _ = report
    fl = pq.read_table(out / "flows").to_pydict()
    ops = pq.read_table(out / "ops").to_pydict()
    comp = pq.read_table(out / "completions").to_pydict()
    assert set(fl) == {"flow_id", "op_id", "kind", "src_ns", "dst_ns", "dst_completion_id"}
    kinds = set(fl["kind"])
    assert {"send-recv", "op-completion", "one-sided"} <= kinds      # the fixture has all three
    for i, op in enumerate(fl["op_id"]):
        assert fl["src_ns"][i] == ops["ns"][op] and ops["dst_qp_id"][op] >= 0
        k, cid = fl["kind"][i], fl["dst_completion_id"][i]
        if k == "send-recv":
            assert cid == ops["peer_completion"][op] and comp["op_id"][cid] == op
            assert fl["dst_ns"][i] == comp["ns"][cid] == ops["peer_ns"][op]
            assert comp["process"][cid] == ops["dst_process"][op]
        elif k == "op-completion":
            assert cid == ops["completion"][op] and fl["dst_ns"][i] == comp["ns"][cid] == ops["complete_ns"][op]
        else:
            assert cid == -1 and fl["dst_ns"][i] == fl["src_ns"][i]
    # the documented join gives the wide view
    q = duckdb.sql(f"""select count(*) filter (where f.src_ns <> o.ns), count(*) from
                      read_parquet('{out}/flows/*.parquet') f join read_parquet('{out}/ops/*.parquet') o using (op_id)""")
    bad, total = q.fetchall()[0]
    assert bad == 0 and total == len(fl["op_id"]) == int(np.sum(np.asarray(ops["dst_qp_id"]) >= 0))
