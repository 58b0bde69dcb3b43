"""The host rows the Perfetto window draws (sigmatrace.tables.host_events): runs of idle polls joined into one
row per run, the same however the event stream is cut into batches or parts."""
import numpy as np
import pytest

from sigmatrace.format import events as E
from sigmatrace.tables.host_events import HostCollector

pytestmark = pytest.mark.sim

PROGRESS, CQ_READ, TAG_SEND = E.value("UCP_WORKER_PROGRESS"), E.value("OFI_CQ_READ"), E.value("UCP_TAG_SEND")


def stream(seed=1, n=3000):
    """Events of 3 threads of 2 processes, interleaved: mostly idle progress (2 workers), some that found
    work, idle fi_cq_read, sends; per thread in time order."""
    rng = np.random.default_rng(seed)
    proc = rng.integers(0, 2, n)
    thread = rng.integers(0, 2, n) * proc       # process 0: thread 0; process 1: threads 0, 1
    kind = rng.choice(5, n, p=[0.88, 0.03, 0.04, 0.03, 0.02])
    typ = np.choose(kind, [PROGRESS, PROGRESS, CQ_READ, TAG_SEND, PROGRESS])
    aux = np.where(kind == 1, rng.integers(1, 4, n), 0)
    obj = np.where(kind == 4, 7, 3)             # a second worker breaks a run
    ns = np.arange(n, dtype=np.int64) * 10 + 1000
    return dict(process=proc, thread=thread, ns=ns, tsc=ns.astype(np.uint64), type=typ, aux=aux, obj=obj,
                arg=np.zeros(n, np.uint64))


def reference(s):
    """The rows by the definition, one event at a time: in a thread's segment (its rows between two of its
    other rows) the idle polls of one key (type, object, requested count) are one row, and every such row
    spans the segment, from its first call to its last."""
    rows, open_seg = [], {}

    def close(seg):
        if seg:
            lo = min(r["ns"] for r in seg.values())
            hi = max(r["end_ns"] for r in seg.values())
            for r in seg.values():
                r["ns"], r["end_ns"] = lo, hi

    for i in range(len(s["ns"])):
        th = (int(s["process"][i]), int(s["thread"][i]))
        idle = int(s["type"][i]) in E.IDLE_POLLS and int(s["aux"][i]) == 0
        ns = int(s["ns"][i])
        seg = open_seg.setdefault(th, {})
        key = (int(s["type"][i]), int(s["obj"][i]), int(s["arg"][i]) & 0xFFFFFFFF)
        if idle and key in seg:
            seg[key]["calls"] += 1
            seg[key]["end_ns"] = ns
            continue
        row = dict(process=th[0], thread=th[1], ns=ns, type=int(s["type"][i]), aux=int(s["aux"][i]),
                   obj=int(s["obj"][i]), calls=1, end_ns=ns)
        rows.append(row)
        if idle:
            seg[key] = row
        else:
            close(seg)
            open_seg[th] = {}
    for seg in open_seg.values():
        close(seg)
    return sorted(tuple(r.values()) for r in rows)


def as_rows(cols):
    return sorted(zip(*(cols[c].tolist() for c in ("process", "thread", "ns", "type", "aux", "obj", "calls",
                                                   "end_ns"))))


def batches(s, step):
    n = len(s["ns"])
    return [{k: v[a:a + step] for k, v in s.items()} for a in range(0, n, step)]


@pytest.mark.parametrize("step", [1, 2, 3, 7, 64, 3000])
def test_idle_runs_joined_whatever_the_batches(step):
    s = stream()
    want = reference(s)
    hc = HostCollector(None)
    for b in batches(s, step):
        hc.add(b)
    cols, total = hc.result()
    assert as_rows(cols) == want and total == len(want)
    assert int(cols["calls"].sum()) == len(s["ns"])             # every call in exactly one row
    assert len(want) < len(s["ns"]) // 2                        # the stream has runs to join


def test_parts_merged_join_the_runs_cut_between_them():
    """A process's events split into parts (tables.parquet, cluster shards): each part's rows, merged in
    part order, give the rows of the whole; the total is corrected by what was joined."""
    s = stream(seed=2)
    want = reference(s)
    parts = []
    for lo, hi in ((0, 911), (911, 912), (912, 2400), (2400, 3000)):
        hc = HostCollector(None)
        hc.add({k: v[lo:hi] for k, v in s.items()})
        parts.append((hc.done, hc.total))
    merged = HostCollector(None)
    for done, _ in parts:
        for d in done:
            merged.add(d)
    cols, _ = merged.result()
    assert as_rows(cols) == want
    assert sum(t for _, t in parts) - merged.joined == len(want)
    assert merged.joined > 0                                   # a run crossed a cut


def test_budget_keeps_the_earliest_rows():
    s = stream(seed=3)
    want = reference(s)
    hc = HostCollector(40)
    for b in batches(s, 5):
        hc.add(b)
    cols, total = hc.result()
    cut = sorted(r[2] for r in want)[39]
    assert total == len(want) and as_rows(cols) == [r for r in want if r[2] <= cut]


@pytest.mark.parametrize("step", [1, 2, 3, 6])
def test_recorder_coalesced_runs(step):
    """The recorder's own form of a run (its first call, then its last one counting the calls since the first,
    events.IDLE_POLLS_SHIFT), nested runs interleaved (ucp_worker_progress over ibv_poll_cq): each run one
    row of all its calls, both spanning the segment; a send ends them; the next poll starts a new one."""
    POLL = E.value("IBV_POLL_CQ")
    polls = lambda n: np.uint64(n) << np.uint64(E.IDLE_POLLS_SHIFT)
    rec = [(100, PROGRESS, 3, 0), (110, POLL, 9, 16), (900, POLL, 9, polls(99) | np.uint64(16)),
           (890, PROGRESS, 3, polls(98)), (1000, TAG_SEND, 5, 64), (1100, PROGRESS, 3, 0)]
    s = dict(process=np.zeros(6, np.int64), thread=np.zeros(6, np.int64),
             ns=np.array([r[0] for r in rec], np.int64), type=np.array([r[1] for r in rec], np.int64),
             aux=np.zeros(6, np.int64), obj=np.array([r[2] for r in rec], np.int64),
             arg=np.array([r[3] for r in rec], np.uint64))
    s["tsc"] = s["ns"].astype(np.uint64)
    hc = HostCollector(None)
    for b in batches(s, step):
        hc.add(b)
    cols, total = hc.result()
    got = sorted(zip(*(cols[c].tolist() for c in ("ns", "type", "obj", "calls", "end_ns"))))
    assert got == sorted([(100, PROGRESS, 3, 99, 900), (100, POLL, 9, 100, 900), (1000, TAG_SEND, 5, 1, 1000),
                          (1100, PROGRESS, 3, 1, 1100)]) and total == 4


class _RunsOnly(HostCollector):
    """Every batch through the general join (the runs path), never the single-rows shortcut."""

    def _join_singles(self, b, o, k, idle, same):
        return self._join_runs(b, o, k, idle)


@pytest.mark.parametrize("p_idle", [0.1, 0.5, 0.88])
@pytest.mark.parametrize("step", [1, 2, 5, 64, 3000])
def test_single_rows_shortcut_equals_the_general_join(p_idle, step):
    """Batches where no two idle polls follow each other on a thread skip the general join's sorts
    (``_join_singles``): the rows, their order, the held runs and the totals are the general join's, and the
    definition's, for streams from sparse idle polls (the shortcut nearly always) to runs (nearly never); with
    a budget, the rows kept and the early cut are the same too."""
    rng = np.random.default_rng(int(p_idle * 100) + step)
    s = stream(seed=5, n=4000)
    s["type"] = np.where(rng.random(4000) < p_idle, PROGRESS, TAG_SEND)
    s["aux"] = np.zeros(4000, np.int64)
    want = reference(s)
    for budget in (None, 300):
        a, b = HostCollector(budget), _RunsOnly(budget)
        for x in batches(s, step):
            a.add(x)
            b.add(x)
        (ca, ta), (cb, tb) = a.result(), b.result()
        assert ta == tb == len(want) and a.joined == b.joined
        assert sorted(ca) == sorted(cb) and all(np.array_equal(ca[c], cb[c]) and ca[c].dtype == cb[c].dtype
                                                 for c in ca)
        if budget is None:
            assert as_rows(ca) == want
        else:
            cut = sorted(r[2] for r in want)[budget - 1]
            assert as_rows(ca) == [r for r in want if r[2] <= cut]
