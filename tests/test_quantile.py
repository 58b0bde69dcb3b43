"""analysis.quantile: exact quantiles in bounded memory equal numpy.quantile (linear) on the same values, per
group, for any bucket width, with NULLs and one-value groups; DuckDB's own quantile_cont cannot run under a
memory limit that the radix selection keeps (the reason it exists)."""
import duckdb
import numpy as np
import pyarrow as pa
import pytest

import sigmatrace.analysis.quantile as Q

pytestmark = pytest.mark.sim
QS = (0.0, 0.1, 0.5, 0.9, 0.99, 1.0)


@pytest.mark.parametrize("bits", [2, 5, 16])
def test_equals_numpy(bits, monkeypatch):
    monkeypatch.setattr(Q, "BUCKET_BITS", bits)
    rng = np.random.default_rng(bits)
    con = duckdb.connect()
    for trial in range(25):
        n = int(rng.integers(1, 2000))
        e = int(rng.integers(1, 18))
        v = rng.integers(-10 ** e, 10 ** e, n)
        g = rng.choice(["a", "b", None, "c"], n).astype(object)
        v[rng.random(n) < 0.05] = v[0]                       # ties
        mask = rng.random(n) < 0.05                          # NULL values: not counted
        con.register("x", pa.table(dict(g=pa.array(g, pa.string()), v=pa.array(v, mask=mask))))
        got = Q.grouped_quantiles(con, "SELECT * FROM x", ["g"], "v", QS)
        con.unregister("x")
        want = {}
        for key in set(g.tolist()):
            sel = np.array([x == key for x in g]) & ~mask
            if sel.any():
                want[(key,)] = list(np.quantile(v[sel], QS))
        assert got == want


def test_one_group_and_constant():
    con = duckdb.connect()
    assert Q.grouped_quantiles(con, "SELECT 7::BIGINT AS v FROM range(5)", [], "v", (0.5, 0.99)) == {(): [7.0, 7.0]}
    assert Q.grouped_quantiles(con, "SELECT range::BIGINT AS v FROM range(10)", [], "v", (0.5,)) == {(): [4.5]}
    assert Q.grouped_quantiles(con, "SELECT NULL::BIGINT AS v", [], "v", (0.5,)) == {}


def test_bounded_where_duckdb_is_not():
    """3 M values under a 64 MB DuckDB limit: quantile_cont runs out of memory, the selection does not."""
    con = duckdb.connect()
    con.execute("SET memory_limit = '64MB'")
    con.execute("SET threads = 1")
    src = "SELECT (hash(range) % 1000000007)::BIGINT AS v FROM range(3000000)"
    with pytest.raises(duckdb.OutOfMemoryException):
        con.execute(f"SELECT quantile_cont(v, 0.5) FROM ({src})").fetchone()
    got = Q.grouped_quantiles(con, src, [], "v", (0.5, 0.99))[()]
    ref = np.quantile(duckdb.connect().execute(src).fetchnumpy()["v"], (0.5, 0.99))
    assert got == list(ref)


@pytest.mark.parametrize("bits", [3, 16])
def test_selection_over_parts_equals_numpy(bits, monkeypatch):
    """The cluster report's way: each part counts its own sorted values per range (count_buckets), the counts
    are merged in any grouping (merge_counts) and fed to one Selection: numpy.quantile of all the values."""
    monkeypatch.setattr(Q, "BUCKET_BITS", bits)
    rng = np.random.default_rng(100 + bits)
    for trial in range(20):
        groups = {}
        for g in ("a", ("k", 1), None):
            n = int(rng.integers(1, 3000))
            e = int(rng.integers(1, 18))
            groups[g] = rng.integers(-10 ** e if trial % 2 else 0, 10 ** e, n)
        cut = {g: np.sort(rng.integers(0, len(v) + 1, 3)) for g, v in groups.items()}
        parts = [{g: np.sort(np.split(v, cut[g])[i]) for g, v in groups.items()} for i in range(4)]
        S = Q.Selection({g: (len(v), int(v.min()), int(v.max())) for g, v in groups.items()}, QS)
        passes = 0
        while S.targets:
            passes += 1
            rg = S.ranges()
            c = [Q.count_buckets(p, rg) for p in parts]
            S.feed_ranges(Q.merge_counts(Q.merge_counts(c[0], c[1]), Q.merge_counts(c[2]), c[3]))
        assert S.result() == {g: list(np.quantile(v, QS)) for g, v in groups.items()}
        assert passes <= -(-64 // bits) + 1
