"""The attribution of work requests to NCCL calls (correlate.collectives) on hand-made tables: the case real
NCCL showed on the H200 -- the broadcast root's calls run ahead of its proxy (the root's kernel ends once the
data is in NCCL's buffer), so a call's last writes are posted after the root's next call.  NCCL's net
transport writes a receiver's buffer only after the receiver announced it, which it does in its own call:
on a sending QP (no receives posted) a unit's window begins at the later of the two ranks' calls.  Checked:
every unit gets exactly its own writes there; a receiving QP (receives posted) keeps its own rank's windows;
across nodes (no common clock before refinement) the bound is not applied; in full mode a completion after
the next unit's window began on its QP still merges the units.
"""
from types import SimpleNamespace

import numpy as np
import pytest

from sigmatrace.correlate import collectives as CO
from sigmatrace.format import events as E

pytestmark = pytest.mark.sim

MiB = 1 << 20


def _cols(rows, names):
    return {n: np.array([r[i] for r in rows], np.uint64 if n == "tsc" else np.int64) for i, n in enumerate(names)}


class Store:
    def __init__(self, calls):
        inits = [(10, p, 0, 0xc0, 0, E.NCCL_INIT_RANK, 1, p, 2, 5) for p in (0, 1)]
        self.t = dict(
            NCCL_COMM_INIT=_cols(inits, ("tsc", "process", "thread", "comm", "result", "variant", "side_id", "rank",
                                         "nranks", "duration_ticks")),
            NCCL_COMM_DESTROY=_cols([], ("tsc", "process", "comm", "how")),
            NCCL_COLL=_cols([(t, p, 0, E.NCCL_COLL_BROADCAST, 7, 0xc0, MiB // 4, 0, E.NCCL_REDOP_NONE, 0, 1)
                             for p, t in calls],
                            ("tsc", "process", "thread", "kind", "datatype", "comm", "count", "result", "redop", "peer",
                             "duration_ticks")),
            NCCL_GROUP_START=_cols([], ("tsc", "process", "thread", "result", "depth")),
            NCCL_GROUP_END=_cols([], ("tsc", "process", "thread", "depth", "simulated", "duration_ticks")))

    def table(self, name):
        return self.t[name]


class Topo:
    """QP 0: rank 0's sending QP -> QP 1 (rank 1's receiving QP); QP 2: rank 1's receiving side of the FIFO
    direction -> QP 3 (rank 0), both created inside the init."""
    n = 4
    process = np.array([0, 1, 1, 0])
    remote = np.array([1, 0, 3, 2])

    def rows(self):
        return [dict(create_tsc=12, process=int(p), create_thread=0) for p in self.process]


def collectives(calls, node_of=(0, 0)):
    procs = [SimpleNamespace(uid=0x100 + p, side_json={1: {"unique_id_hash": "abc"}}) for p in (0, 1)]
    threads = dict(process=np.array([0, 1]), thread=np.array([0, 0]), name=np.array(["main", "main"], object))
    return CO.Collectives(SimpleNamespace(warnings=[]), Store(calls), procs, Topo(), threads, np.array(node_of))


# the root (rank 0) calls broadcasts 0, 1, 2 at 100, 200, 300; rank 1 (the receiver) at 150, 400, 600, each
# after it received the previous one.  The root's proxy posts broadcast k's 1 MiB in 4 writes of 256 KiB
# between rank 1's call k and rank 1's call k+1, two of them after the root's call k+1.
CALLS = [(0, 100), (0, 200), (0, 300), (1, 150), (1, 400), (1, 600)]
WRITES = [(0, t, MiB // 4) for t in (160, 170, 210, 220, 410, 420, 450, 460, 610, 620, 630, 640)]
# rank 1 announces its buffers (16-byte FIFO writes, QP 2) right after each of its calls
FIFO = [(2, t, 16) for t in (151, 401, 601)]


def ops_of(rows):
    return dict(qp_id=np.array([r[0] for r in rows], np.int64), tsc=np.array([r[1] for r in rows], np.uint64),
                num_wr=np.ones(len(rows), np.int64), bytes=np.array([r[2] for r in rows], np.int64))


def attributed(c, ops, receiving, completion=None, wc_tsc=()):
    comp = np.full(len(ops["tsc"]), -1, np.int64) if completion is None else completion
    c.attribute(ops, comp, np.asarray(wc_tsc, np.uint64), receiving)
    return ops["collective_id"], ops["collective_unit"]


def test_root_running_ahead_every_broadcast_gets_its_own_writes():
    c = collectives(CALLS)
    ops = ops_of(WRITES + FIFO)
    cid, unit = attributed(c, ops, receiving=[1, 2])
    assert (unit >= 0).all()
    root = np.flatnonzero(c.process == 0)
    # each root call its own unit, with exactly its 1 MiB
    assert len({int(c.unit[k]) for k in root}) == 3 and not c.merged.any()
    for k in root:
        assert c.u_bytes[c.unit[k]] == MiB and c.u_wrs[c.unit[k]] == 4
    np.testing.assert_array_equal(cid[:12], np.repeat(root, 4))
    # the receiver's FIFO writes: its own calls' windows (a receiving QP)
    np.testing.assert_array_equal(cid[12:], np.flatnonzero(c.process == 1))
    assert set(c.attribution_labels().tolist()) == {"window"}


def test_without_the_peer_bound_the_writes_slip_to_the_next_call():
    """The same writes where the rule does not apply: QP 0 posting receives, or the ranks on two nodes."""
    for receiving, node_of in (([0, 1, 2], (0, 0)), ([1, 2], (0, 1))):
        c = collectives(CALLS, node_of)
        ops = ops_of(WRITES + FIFO)
        attributed(c, ops, receiving)
        root = np.flatnonzero(c.process == 0)
        got = [int(c.u_bytes[c.unit[k]]) for k in root]
        assert got != [MiB] * 3 and sum(got) == 3 * MiB, (receiving, node_of, got)


def test_a_completion_after_the_next_window_merges_on_its_qp():
    """Full mode: broadcast 0's last write completes at 405, after broadcast 1's window began on QP 0 (400):
    the two calls' work overlapped, so they become one in-flight unit holding both calls' bytes."""
    c = collectives(CALLS)
    ops = ops_of(WRITES + FIFO)
    comp = np.full(len(ops["tsc"]), -1, np.int64)
    comp[3] = 0
    attributed(c, ops, [1, 2], comp, wc_tsc=[405])
    root = np.flatnonzero(c.process == 0)
    assert c.unit[root[0]] == c.unit[root[1]] != c.unit[root[2]]
    assert c.u_bytes[c.unit[root[0]]] == 2 * MiB and c.u_bytes[c.unit[root[2]]] == MiB
    assert c.attribution_labels()[root[0]] == "in-flight"
    # the same completion at 395 is inside broadcast 0's window on QP 0: no merge
    c = collectives(CALLS)
    ops = ops_of(WRITES + FIFO)
    attributed(c, ops, [1, 2], comp, wc_tsc=[395])
    assert not c.merged.any()
