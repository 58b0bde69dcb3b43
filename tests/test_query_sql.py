"""Named SQL analyses over the correlated tables; PerfettoSQL path (skips without trace_processor)."""
import pytest

from sigmatrace.query import find_trace_processor, named_queries, perfetto_query, run_named, connect

pytestmark = pytest.mark.sim


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from sigmatrace.cli.report import build_report
    from sigmatrace.correlate.synth import write_synthetic
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
