"""The table schema is declared once (sigmatrace/schema.py): docs/schema.md is generated from it, every table
a report writes follows it, and the writer refuses a table that drifts from it."""
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sigmatrace import schema
from sigmatrace.correlate import correlate
from sigmatrace.tables import SchemaMismatch, conform, write_tables

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "fixtures"


def test_docs_table_reference_is_generated_from_the_schema():
    doc = (ROOT / "docs" / "schema.md").read_text()
    m = re.search(r"<!-- schema:begin[^\n]*-->\n(.*?)<!-- schema:end -->", doc, re.S)
    assert m, "docs/schema.md lost its schema:begin / schema:end markers"
    assert m.group(1) == schema.markdown(), "docs/schema.md is stale: run `python -m sigmatrace.schema`"


@pytest.mark.parametrize("fixture", ["moe.bin", "allreduce_aggregate.bin", "allreduce_full.bin", "pingpong.bin"])
def test_written_tables_follow_the_schema(tmp_path, fixture):
    corr = correlate(FIX / fixture, workers=1)
    write_tables(corr, tmp_path)
    for t in schema.TABLES:
        path = tmp_path / (t.name if t.parts else f"{t.name}.parquet")
        assert path.is_dir() == t.parts, t.name
        got = pq.read_schema(next(path.glob("*.parquet")) if t.parts else path)
        assert tuple(got.names) == t.names, t.name
        for c, f in zip(t.columns, got):
            typ = f.type.value_type if pa.types.is_dictionary(f.type) else f.type
            assert str(typ) == c.type, (t.name, c.name, f.type)


def test_writer_refuses_a_drifted_table():
    good = pa.table({c.name: pa.array(np.zeros(2, np.int64)) for c in schema.BY_NAME["nodes"].columns
                     if c.type == "int64"} | {"label": pa.array(["a", "b"])})
    assert conform("nodes", good).column_names == list(schema.columns("nodes"))   # reordered to the schema
    with pytest.raises(SchemaMismatch, match="columns"):
        conform("nodes", good.append_column("extra", pa.array([1, 2])))
    with pytest.raises(SchemaMismatch, match="types"):
        conform("nodes", good.set_column(0, "node", pa.array([0.5, 1.5])))
    empty = pa.table({"node": pa.array([], pa.float64()), "label": pa.array([], pa.int64()),
                      "processes": pa.array([], pa.int64())})
    assert conform("nodes", empty).schema.field("label").type == pa.string()      # empty: cast to the schema


def test_correlator_columns_come_from_the_schema():
    from sigmatrace.correlate import derived, ops
    assert derived.FLOW_COLUMNS == schema.columns("flows")
    assert ops.OPS_COLUMNS == schema.columns("ops")
    assert ops.COMPLETION_COLUMNS == schema.columns("completions")


def test_unknown_latency_is_null_in_the_written_tables(tmp_path):
    """latency_ns is nullable: -1 in the correlator's numpy columns becomes NULL in every written part (the
    field is OPTIONAL even in a part without any), so SQL aggregates count measured latencies only."""
    import duckdb
    assert schema.BY_NAME["ops"].nullable == ("latency_ns",)
    assert schema.BY_NAME["completions"].nullable == ("latency_ns",)
    corr = correlate(FIX / "allreduce_full.bin", workers=1)
    write_tables(corr, tmp_path)
    for name in ("ops", "completions"):
        lat = np.asarray(corr.tables[name]["latency_ns"])
        known = lat[lat != schema.NULL_SENTINEL]
        assert 0 < len(known) < len(lat), name          # some measured, some not: both cases are checked
        t = pq.read_table(tmp_path / name)
        assert t.schema.field("latency_ns").nullable and t.column("latency_ns").null_count == len(lat) - len(known)
        assert not t.schema.field("op_id" if name == "ops" else "completion_id").nullable
        got = duckdb.connect().execute(f"SELECT count(latency_ns), avg(latency_ns), median(latency_ns), min(latency_ns) "
                         f"FROM read_parquet('{tmp_path / name}/*.parquet')").fetchone()
        assert got[0] == len(known) and abs(got[1] - known.mean()) < 1e-6 * known.mean()
        assert got[2] == np.median(known) and got[3] >= 0
    # a table where nothing is known: every value NULL, the field still nullable (one schema for every part)
    corr = correlate(FIX / "pingpong.bin", workers=1)
    write_tables(corr, tmp_path / "pp")
    t = pq.read_table(tmp_path / "pp" / "ops")
    assert t.schema.field("latency_ns").nullable and t.column("latency_ns").null_count == t.num_rows > 0


def test_schema_spec_nullable_marker():
    t = schema.table("x", "row", "a int64, b int64?, c string")
    assert [c.nullable for c in t.columns] == [False, True, False] and t.type_of("b") == "int64"
    with pytest.raises(ValueError, match="unknown types"):
        schema.table("x", "row", "a int65")
