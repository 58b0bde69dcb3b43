"""Named SQL analyses over the correlated tables; PerfettoSQL path (skips without trace_processor)."""
import pytest

from sigmatrace.query import find_trace_processor, named_queries, perfetto_query, run_named, connect

pytestmark = pytest.mark.sim


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from sigmatrace.report import build_report
    from sigmatrace_sim.synthetic import write_synthetic
    cap, _ = write_synthetic(tmp_path_factory.mktemp("cap"), seed=2)
    out = tmp_path_factory.mktemp("rep")
    build_report(cap, out, figures=False, quiet=True)
    return out


def test_every_named_query_runs(report):
    con = connect(report)
    for name in named_queries():
        cur = run_named(con, name, bin_ns=100_000)
        assert cur.description is not None, name
        cur.fetchall()


def test_perfetto_sql(report):
    tp = find_trace_processor()
    if not tp:
        pytest.skip("no trace_processor binary (set SIGMATRACE_TRACE_PROCESSOR)")
    out = perfetto_query(report, "select count(*) from slice", trace_processor=tp)
    assert out.strip()


def skew_of(con, rows, n):
    """ops of (node, dst_node, bytes) rows, one GPU per node (numbered as the nodes), n nodes: the rows of
    the shipped skew_node and skew_gpu queries, by name."""
    con.execute("CREATE TABLE ops AS SELECT * FROM (VALUES " + ",".join(f"({a},{b},{c},{a},{b})" for a, b, c in rows)
                + ") t(node, dst_node, bytes, gpu, dst_gpu)")
    con.execute(f"CREATE TABLE nodes AS SELECT range AS node FROM range({n})")
    con.execute(f"CREATE TABLE gpus AS SELECT range AS gpu FROM range({n})")
    out = {}
    for name in ("skew_node", "skew_gpu"):
        cur = run_named(con, name)
        out[name] = dict(zip([d[0] for d in cur.description], cur.fetchone()))
    return out


def test_skew_ties_pick_one_pair_lowest_ids():
    """A ring (every node sends the same bytes to the next): every pair and every node ties.  The heaviest
    pair is one real pair and ties go to the lowest ids, so summary.json is the same on every run (DuckDB's
    arg_max returns whichever tied row its hash aggregation meets first: 100 -> 3 here, a run of the
    full-mode AllReduce fixture gave another ingress node on each of two runs)."""
    import duckdb
    con = duckdb.connect()
    ids = [100, 3, 57, 21]
    rows = [(ids[s], ids[(s + 1) % len(ids)], 1000) for s in range(len(ids)) for _ in range(50)]
    for name, r in skew_of(con, rows, len(ids)).items():
        assert (r["heaviest_src"], r["heaviest_dst"]) == (3, 57), (name, r)
        if name == "skew_node":
            assert (r["heaviest_egress_node"], r["heaviest_ingress_node"]) == (3, 3), r


def test_split_queries_from_their_parts_equal_the_queries(report):
    """Each query of analysis.summable.SPLIT, run from its ``part`` rows merged over disjoint slices of the
    ops table (the cluster report's way), gives the query's rows over the whole table -- and that is not
    trivially so: the ops rows are split by op_id into three slices whose keys overlap."""
    import duckdb
    from sigmatrace.analysis.summable import SPLIT, merge, partial, split_rest
    con = connect(report)
    n = con.execute("SELECT count(*) FROM ops").fetchone()[0]
    assert n > 30
    parts = []
    for lo, hi in ((0, n // 3), (n // 3, 2 * n // 3), (2 * n // 3, n)):
        c = connect(report, duckdb.connect())
        c.execute(f"CREATE OR REPLACE VIEW ops AS SELECT * FROM ({_ops_src(report)}) WHERE op_id >= {lo} AND op_id < {hi}")
        parts.append(partial(c, tuple(f"{q}.part" for q in SPLIT)))
    merged = merge(*parts)
    for name in SPLIT:
        cur = run_named(con, name)
        cols = [d[0] for d in cur.description]
        want = [dict(zip(cols, r)) for r in cur.fetchall()]
        assert want and split_rest(con, name, merged) == want, name
        # control: one slice alone is not the whole table
        assert split_rest(con, name, parts[0]) != want, name


def _ops_src(report):
    from sigmatrace.query import _table_sources
    return "SELECT * FROM " + dict(_table_sources(report / "tables"))["ops"]
