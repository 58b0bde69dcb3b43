"""NCCL collectives (F25): communicators, the collective and point-to-point calls, and the work requests each
one caused.  The rules are documented in docs/schema.md ("Collectives: how work requests are attributed").

Communicators.  Every accepted ``ncclCommInit*`` / ``ncclCommSplit`` (NCCL_COMM_INIT) starts a communicator
instance of its process (the tracer's comm id names it until ``ncclCommDestroy`` / ``ncclCommAbort`` or a
later creation at the same address).  Its cross-process *key* joins the ranks of one communicator: the hash
of the unique id(s) and the size (``ncclCommInitRank[Config|Scalable]``), the parent's key with the k-th
split of that parent and the color (``ncclCommSplit``; every rank splits its parent the same number of
times), or the process and the k-th ``ncclCommInitAll`` (one process holds the whole clique).

Calls.  NCCL_COLL records every call with its result; only accepted calls (ncclSuccess, ncclInProgress) of
a known communicator are *executed*, except those of a group ended by ``ncclGroupSimulateEnd``.  ``group``:
the outermost ncclGroupStart..ncclGroupEnd of the calling thread.  ``seq``: the k-th executed collective of
the communicator instance, or for point-to-point the k-th send to (receive from) that peer; the cross-rank
*instance* of a call is (key, seq) -- (key, sender, receiver, k) for send/recv -- so one rank's k-th
all_reduce meets the others' k-th.

QPs of a communicator.  A QP created while exactly one communicator of its process had a call in progress
(its ncclCommInit* / ncclCommSplit, one of its collective or point-to-point calls, or the ncclGroupEnd of a
group holding its calls: NCCL creates its connections inside these, on the calling thread or on its proxy
service thread while the caller waits) belongs to that communicator (``comm_rule`` "call"); a QP created
outside every call by a thread that created QPs of exactly one communicator inside its calls belongs to
that one while it lives ("comm-thread"); else, when the process has exactly one communicator alive and the
QP was created by a thread named "NCCL*" (NCCL's own threads, named with NCCL_SET_THREAD_NAME=1: a
non-blocking init that connects after the call returned), to that one ("nccl-thread"); else to none.

Attribution.  NCCL's proxy executes a communicator's operations in call order.  Per communicator the calls
form *units* -- one call, or the communicator's calls of one NCCL group -- and the work requests (ops rows:
work requests, post calls, GPU WQEs) on the communicator's QPs posted from a unit's first call up to the
next unit's first call are the unit's; on a *sending* QP (no receives posted, its peer a QP of the same
communicator in another process of the node) the window begins at the later of the two ranks' calls of the
unit's instances, since NCCL's net transport writes a receive buffer only after the receiver announced it
in its own call.  No work of a later unit can come before its call; work of an earlier one can (a call made
while the previous one was still running, "in flight"): where the trace shows it -- a completion of a unit's
work request after the next unit's window began on its QP (full mode), or a unit that moves data on a
communicator with QPs but posted nothing before the next call -- the units are merged and their work requests
attributed to the merged unit.  Merging never attributes a work request wrongly, it only attributes it to
more calls.  The window is exact when each call's work is posted before the communicator's next call (a
program that waits for each call, as benchmarks do); for calls issued back to back, work that a unit posts
after the next call without either sign is attributed to the next unit (docs/schema.md).  ``ops.collective_id`` is the call when its unit holds one
call, else -1; ``ops.collective_unit`` the unit (-1: not attributed).
"""
from __future__ import annotations

import numpy as np

from ..format import events as E

KINDS = {E.NCCL_COLL_ALL_REDUCE: "all_reduce", E.NCCL_COLL_BROADCAST: "broadcast", E.NCCL_COLL_BCAST: "broadcast",
         E.NCCL_COLL_REDUCE: "reduce", E.NCCL_COLL_ALL_GATHER: "all_gather",
         E.NCCL_COLL_REDUCE_SCATTER: "reduce_scatter", E.NCCL_COLL_ALL_TO_ALL: "all_to_all",
         E.NCCL_COLL_GATHER: "gather", E.NCCL_COLL_SCATTER: "scatter", E.NCCL_COLL_SEND: "send",
         E.NCCL_COLL_RECV: "recv"}
P2P = (E.NCCL_COLL_SEND, E.NCCL_COLL_RECV)
DATATYPES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64", "bfloat16",
             "float8e4m3", "float8e5m2")
DT_SIZE = np.array([1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1] + [0] * 244, np.int64)
REDOPS = ("sum", "prod", "max", "min", "avg")
INIT_CALLS = {E.NCCL_INIT_RANK: "ncclCommInitRank", E.NCCL_INIT_RANK_CONFIG: "ncclCommInitRankConfig",
              E.NCCL_INIT_ALL: "ncclCommInitAll", E.NCCL_INIT_RANK_SCALABLE: "ncclCommInitRankScalable",
              E.NCCL_INIT_SPLIT: "ncclCommSplit"}
ACCEPTED = (0, 7)            # ncclSuccess, ncclInProgress
TYPES = ("NCCL_COMM_INIT", "NCCL_COMM_DESTROY", "NCCL_COLL", "NCCL_GROUP_START", "NCCL_GROUP_END")
_END = np.iinfo(np.int64).max


def _i32(v):
    """u32 record fields that hold an int (rank, peer): -1 for 0xffffffff."""
    return np.asarray(v, np.uint32).view(np.int32).astype(np.int64)


def redop_name(code):
    code = int(code)
    return "" if code == E.NCCL_REDOP_NONE else REDOPS[code] if code < len(REDOPS) else "premulsum"


class Collectives:
    """Communicators, calls, QP ownership and work-request attribution of one capture."""

    def __init__(self, out, st, procs, topo, threads, node_of=None):
        self.procs = procs
        self.node_of = np.asarray(node_of if node_of is not None else np.zeros(len(procs)), np.int64)
        self.warnings = out.warnings
        t = {n: st.table(n) for n in TYPES}
        self._communicators(t["NCCL_COMM_INIT"], t["NCCL_COMM_DESTROY"], procs)
        self._calls(t["NCCL_COLL"])
        self._groups(t["NCCL_GROUP_START"], t["NCCL_GROUP_END"], t["NCCL_COMM_INIT"])
        self._sequence()
        names = {(int(p), int(th)): str(n) for p, th, n in zip(threads["process"], threads["thread"], threads["name"])}
        self._qp_owners(topo, names)

    # ---- communicators -------------------------------------------------------------------------------------
    def _communicators(self, ci, cd, procs):
        self.comms = []                       # dicts, in (process, time) order
        by = {}                               # (process, comm obj) -> [instance index], by start time
        splits = {}                           # parent instance -> splits so far
        n = len(ci["tsc"])
        self.init_inst = np.full(n, -1, np.int64)
        order = np.lexsort((ci["tsc"], ci["process"])) if n else np.zeros(0, np.int64)
        rank, nranks = _i32(ci["rank"]), ci["nranks"].astype(np.int64)
        for k in order.tolist():
            p, obj, t0 = int(ci["process"][k]), int(ci["comm"][k]), int(ci["tsc"][k])
            res, variant = int(ci["result"][k]), int(ci["variant"][k])
            js = procs[p].side_json.get(int(ci["side_id"][k]))
            js = js if isinstance(js, dict) else {}
            key = None
            nr = int(nranks[k]) if nranks[k] < (1 << 31) else -1
            if variant == E.NCCL_INIT_SPLIT:
                parent = self._at(by, p, int(js.get("parent", 0) or 0), t0)
                if res in ACCEPTED and parent >= 0:
                    idx = splits.get(parent, 0)
                    splits[parent] = idx + 1
                    pk = self.comms[parent]["key"]
                    if pk is not None:
                        key = f"{pk}/split{idx}:color{js.get('color')}"
            elif variant == E.NCCL_INIT_ALL:
                ia = js.get("init_all_index")
                if ia is not None:
                    key = f"initall:{procs[p].uid:x}:{ia}:{nr}"
            elif js.get("unique_id_hash"):
                key = f"{js['unique_id_hash']}:{nr}"
            if res not in ACCEPTED or obj == 0:
                continue
            i = len(self.comms)
            self.init_inst[k] = i
            self.comms.append(dict(process=p, obj=obj, t0=t0, dur=int(ci["duration_ticks"][k]), end=_END, key=key,
                                   variant=variant, rank=int(rank[k]), nranks=nr, result=res,
                                   cuda_dev=int(js.get("cuda_dev", -1) if js.get("cuda_dev") is not None else -1),
                                   thread=int(ci["thread"][k])))
            lst = by.setdefault((p, obj), [])
            if lst:                           # a new communicator at the same address ends the old one
                prev = self.comms[lst[-1]]
                prev["end"] = min(prev["end"], t0)
            lst.append(i)
        for k in range(len(cd["tsc"])):
            if int(cd["how"][k]) == E.NCCL_END_FINALIZE:
                continue
            i = self._at(by, int(cd["process"][k]), int(cd["comm"][k]), int(cd["tsc"][k]))
            if i >= 0:
                self.comms[i]["end"] = min(self.comms[i]["end"], int(cd["tsc"][k]))
        self.by = by
        for i, c in enumerate(self.comms):
            if c["key"] is None:              # no cross-process identity: this process's own
                c["key"] = f"local:{procs[c['process']].uid:x}:{c['obj']}:{i}"
                c["joinable"] = False
            else:
                c["joinable"] = True

    def _at(self, by, p, obj, t):
        """The instance of communicator obj of process p alive at time t (-1: none)."""
        for i in reversed(by.get((p, obj), [])):
            c = self.comms[i]
            if c["t0"] <= t:
                return i if t <= c["end"] else -1
        return -1

    # ---- calls ---------------------------------------------------------------------------------------------
    def _calls(self, cc):
        n = len(cc["tsc"])
        o = np.lexsort((cc["tsc"], cc["process"])) if n else np.zeros(0, np.int64)
        self.n = n
        self.process = cc["process"][o].astype(np.int64)
        self.thread = cc["thread"][o].astype(np.int64)
        self.tsc = cc["tsc"][o].astype(np.uint64)
        self.kind = cc["kind"][o].astype(np.int64)
        self.dt = cc["datatype"][o].astype(np.int64)
        self.obj = cc["comm"][o].astype(np.int64)
        self.count = cc["count"][o].astype(np.int64)
        self.result = cc["result"][o].astype(np.int64)
        self.redop = cc["redop"][o].astype(np.int64)
        self.peer = _i32(cc["peer"][o])
        self.dur = cc["duration_ticks"][o].astype(np.int64)
        self.inst = np.full(n, -1, np.int64)
        for (p, obj), lst in self.by.items():
            sel = np.flatnonzero((self.process == p) & (self.obj == obj))
            if not len(sel):
                continue
            t0 = np.array([self.comms[i]["t0"] for i in lst], np.uint64)
            end = np.array([self.comms[i]["end"] for i in lst], np.int64)
            j = np.searchsorted(t0, self.tsc[sel], "right") - 1
            ok = j >= 0
            jj = np.maximum(j, 0)
            ok &= self.tsc[sel].astype(np.int64) <= end[jj]
            self.inst[sel[ok]] = np.array(lst, np.int64)[jj[ok]]

    def _groups(self, gs, ge, ci):
        """``group`` of every call (outermost ncclGroupStart..End of its thread), the simulated groups, and
        the ncclGroupEnd windows with the communicators they launched or created."""
        n = self.n
        self.group = np.full(n, -1, np.int64)
        simulated = []
        self.group_windows = []               # (process, begin tsc, end tsc, group)
        ev = []
        for k in range(len(gs["tsc"])):
            if int(gs["result"][k]) == 0 and int(gs["depth"][k]) == 1:
                ev.append((int(gs["process"][k]), int(gs["thread"][k]), int(gs["tsc"][k]), 0, k))
        for k in range(len(ge["tsc"])):
            if int(ge["depth"][k]) == 1:
                ev.append((int(ge["process"][k]), int(ge["thread"][k]), int(ge["tsc"][k]), 1, k))
        for k in range(n):
            ev.append((int(self.process[k]), int(self.thread[k]), int(self.tsc[k]), 2, k))
        for k in range(len(ci["tsc"])):
            ev.append((int(ci["process"][k]), int(ci["thread"][k]), int(ci["tsc"][k]), 3, k))
        ev.sort()
        open_ = {}
        members = []                          # per group: (call indices, init indices)
        for p, th, t, what, k in ev:
            key = (p, th)
            if what == 0:
                open_[key] = len(members)
                members.append(([], []))
                simulated.append(False)
            elif what == 1:
                g = open_.pop(key, None)
                if g is not None:
                    simulated[g] = bool(ge["simulated"][k])
                    self.group_windows.append((p, t, t + int(ge["duration_ticks"][k]), g))
            elif key in open_:
                members[open_[key]][0 if what == 2 else 1].append(k)
                if what == 2:
                    self.group[k] = open_[key]
        self.n_groups = len(members)
        self.group_comms = []
        for calls, inits in members:
            s = {int(self.inst[k]) for k in calls if self.inst[k] >= 0}
            s |= {int(self.init_inst[k]) for k in inits if self.init_inst[k] >= 0}
            self.group_comms.append(s)
        sim = np.array(simulated + [False], bool)
        self.simulated = sim[self.group] & (self.group >= 0) if n else np.zeros(0, bool)
        self.executed = np.isin(self.result, ACCEPTED) & (self.inst >= 0) & ~self.simulated

    def _sequence(self):
        """``seq`` and the cross-rank ``instance`` id of every executed call."""
        n = self.n
        self.seq = np.full(n, -1, np.int64)
        self.instance = np.full(n, -1, np.int64)
        ex = np.flatnonzero(self.executed)
        if not len(ex):
            return
        p2p = np.isin(self.kind[ex], P2P)
        # collectives: per instance; send/recv: per (instance, peer, direction)
        gk = np.where(p2p, (self.inst[ex] << 22) + ((self.peer[ex] & 0xFFFFF) << 1)
                      + (self.kind[ex] == E.NCCL_COLL_RECV), self.inst[ex] << 22 | (1 << 21))
        o = np.lexsort((self.tsc[ex], gk))
        sk = gk[o]
        start = np.ones(len(o), bool)
        start[1:] = sk[1:] != sk[:-1]
        pos = np.arange(len(o))
        first = np.maximum.accumulate(np.where(start, pos, 0))
        self.seq[ex[o]] = pos - first
        ids = {}
        for k in ex.tolist():
            c = self.comms[self.inst[k]]
            if not c["joinable"]:
                continue
            if self.kind[k] == E.NCCL_COLL_SEND:
                key = (c["key"], "p2p", c["rank"], int(self.peer[k]), int(self.seq[k]))
            elif self.kind[k] == E.NCCL_COLL_RECV:
                key = (c["key"], "p2p", int(self.peer[k]), c["rank"], int(self.seq[k]))
            else:
                key = (c["key"], "coll", int(self.seq[k]))
            self.instance[k] = ids.setdefault(key, len(ids))

    # ---- QPs -----------------------------------------------------------------------------------------------
    def _qp_owners(self, topo, thread_names):
        nq = topo.n
        self.qp_comm = np.full(nq + 1, -1, np.int64)      # + sentinel for ops without a QP
        self.qp_process = np.asarray(topo.process, np.int64)[:nq] if nq else np.zeros(0, np.int64)
        self.qp_remote = np.asarray(topo.remote, np.int64)[:nq] if nq else np.zeros(0, np.int64)
        self.qp_rule = np.array([""] * nq, dtype=object)
        if not self.comms or not nq:
            return
        win = []                                           # (process, begin, end, instance)
        for c_i, c in enumerate(self.comms):
            win.append((c["process"], c["t0"], c["t0"] + c["dur"], c_i))
        ex = np.flatnonzero(np.isin(self.result, ACCEPTED) & (self.inst >= 0))
        for k in ex.tolist():
            win.append((int(self.process[k]), int(self.tsc[k]), int(self.tsc[k]) + int(self.dur[k]), int(self.inst[k])))
        for p, b, e, g in self.group_windows:
            for c_i in self.group_comms[g]:
                win.append((p, b, e, c_i))
        w = np.array(win, np.int64).reshape(-1, 4)
        rows = topo.rows()
        outside = []                                       # QPs created outside every call
        for q, r in enumerate(rows):
            t = int(r["create_tsc"])
            if t <= 0:
                continue
            p = int(r["process"])
            m = (w[:, 0] == p) & (w[:, 1] <= t) & (t <= w[:, 2])
            cand = np.unique(w[m, 3])
            if len(cand) == 1:
                self.qp_comm[q], self.qp_rule[q] = int(cand[0]), "call"
            elif not len(cand):
                outside.append(q)
        # a thread that created QPs of exactly one communicator inside its calls (NCCL's proxy service thread)
        # is that communicator's: its other QPs are too, while the communicator lives
        of_thread = {}
        for q in np.flatnonzero(self.qp_comm[:nq] >= 0).tolist():
            key = (int(rows[q]["process"]), int(rows[q].get("create_thread", -1)))
            of_thread.setdefault(key, set()).add(int(self.qp_comm[q]))
        for q in outside:
            r = rows[q]
            p, t, th = int(r["process"]), int(r["create_tsc"]), int(r.get("create_thread", -1))
            mine = of_thread.get((p, th), set())
            if len(mine) == 1:
                c_i = next(iter(mine))
                if self.comms[c_i]["t0"] <= t < self.comms[c_i]["end"]:
                    self.qp_comm[q], self.qp_rule[q] = c_i, "comm-thread"
                continue
            alive = [i for i, c in enumerate(self.comms) if c["process"] == p and c["t0"] <= t < c["end"]]
            if len(alive) == 1 and not mine and thread_names.get((p, th), "").startswith("NCCL"):
                self.qp_comm[q], self.qp_rule[q] = alive[0], "nccl-thread"

    # ---- attribution ---------------------------------------------------------------------------------------
    def attribute(self, ops, op_completion, wc_tsc, receiving=()):
        """``ops["collective_id"]`` / ``ops["collective_unit"]`` (base columns, -1 where not attributed); the
        units (attribution units: one call, a group's calls, or calls merged while in flight).  Three steps,
        so that the cluster report runs the two per-operation ones next to each process's operations:
        ``unit_stats`` (per operation), ``merge_units`` (per communicator), ``label_ops`` (per operation).
        ``receiving``: the QPs that posted receives (``receiving_qps``)."""
        self.merge_units([self.unit_stats(ops, op_completion, wc_tsc, receiving)])
        ops["collective_id"], ops["collective_unit"] = self.label_ops(ops, receiving)

    def _plan(self):
        """Per communicator with executed calls: (calls in time order, each call's unit before merging, the
        units' first call tsc, end of the communicator)."""
        plan = getattr(self, "_unit_plan", None)
        if plan is not None:
            return plan
        plan = {}
        for c_i, c in enumerate(self.comms):
            calls = np.flatnonzero(self.executed & (self.inst == c_i))
            if not len(calls):
                continue
            calls = calls[np.argsort(self.tsc[calls], kind="stable")]
            g = self.group[calls]
            new = np.ones(len(calls), bool)
            new[1:] = (g[1:] < 0) | (g[1:] != g[:-1])
            plan[c_i] = (calls, np.cumsum(new) - 1, self.tsc[calls[new]].astype(np.int64), c["end"])
        self._unit_plan = plan
        return plan

    def _peer_starts(self, c_i, c_j):
        """The units' window starts of communicator instance c_i on a QP whose work needs the peer's matching
        call (a sending QP of NCCL's net transport, its peer's instance c_j): per unit the later of its own
        first call and the peer's earliest call of the same cross-rank instances.  None where the bound does
        not apply: another communicator, no call joined, or another node (no common clock before the clocks
        are refined)."""
        cache = self.__dict__.setdefault("_peer_plan", {})
        if (c_i, c_j) in cache:
            return cache[(c_i, c_j)]
        plan, res = self._plan(), None
        a, b = self.comms[c_i], self.comms[c_j]
        if (c_j != c_i and c_j in plan and a["joinable"] and b["joinable"] and a["key"] == b["key"]
                and a["process"] != b["process"] and self.node_of[a["process"]] == self.node_of[b["process"]]):
            calls, src_unit, starts, _ = plan[c_i]
            theirs = plan[c_j][0]
            ok = self.instance[theirs] >= 0
            t_of = dict(zip(self.instance[theirs][ok].tolist(), self.tsc[theirs][ok].astype(np.int64).tolist()))
            peer = np.full(len(starts), -1, np.int64)
            for k, u in zip(calls.tolist(), src_unit.tolist()):
                t = t_of.get(int(self.instance[k]))
                if t is not None and (peer[u] < 0 or t < peer[u]):
                    peer[u] = t
            if (peer >= 0).any():
                res = np.maximum.accumulate(np.maximum(starts, peer))
        cache[(c_i, c_j)] = res
        return res

    def _op_units(self, ops, receiving=()):
        """(communicator, operation rows, their units before merging, the window starts they were placed by)
        of the operations inside a unit's window: by the communicator's call times, or on a sending QP (one
        that posts no receives, connected to a QP of the same communicator in another process of the node)
        by the later of the two ranks' calls (docs/schema.md)."""
        q = np.asarray(ops["qp_id"]).astype(np.int64)
        no = len(q)
        op_comm = np.where(q >= 0, self.qp_comm[np.where(q >= 0, q, len(self.qp_comm) - 1)], -1) if no else \
            np.zeros(0, np.int64)
        recv = np.zeros(len(self.qp_comm), bool)
        rq = np.asarray(receiving, np.int64)
        recv[rq[(rq >= 0) & (rq < len(recv))]] = True
        plan = self._plan()
        for c_i in np.unique(op_comm[op_comm >= 0]).tolist():
            if c_i not in plan:
                continue
            _, _, starts, end = plan[c_i]
            sel = np.flatnonzero(op_comm == c_i)
            t = ops["tsc"][sel].astype(np.int64)
            by = {}                                   # window starts -> positions in sel
            qs = q[sel]
            for qq in np.unique(qs).tolist():
                r = int(self.qp_remote[qq]) if qq < len(self.qp_remote) else -1
                ps = None
                if not recv[qq] and r >= 0 and self.qp_comm[r] >= 0:
                    ps = self._peer_starts(c_i, int(self.qp_comm[r]))
                key = id(ps) if ps is not None else 0
                by.setdefault(key, (ps if ps is not None else starts, []))[1].append(np.flatnonzero(qs == qq))
            for st_, pos in by.values():
                pos = np.concatenate(pos)
                u = np.searchsorted(st_, t[pos], "right") - 1
                keep = (u >= 0) & (t[pos] <= end)
                yield c_i, sel[pos[keep]], u[keep], st_

    def unit_stats(self, ops, op_completion, wc_tsc, receiving=()):
        """Per communicator, per unit before merging: operations, work requests, bytes, first / last post, last
        completion (tsc of the unit's process; -1 / _END when none) and ``reach`` (the latest unit whose window
        had begun, on the operation's QP, when one of these operations completed) of these operations.  Counts
        and sums add up and the extremes combine across parts of the operations (``merge_units`` takes a
        list)."""
        comp = np.asarray(op_completion, np.int64)
        out = {}
        for c_i, sel, u, starts in self._op_units(ops, receiving):
            nu = len(self._plan()[c_i][2])
            c_tsc = np.full(len(sel), -1, np.int64)
            cs = comp[sel]
            has = cs >= 0
            if has.any():
                c_tsc[has] = np.asarray(wc_tsc, np.uint64)[cs[has]].astype(np.int64)
            reach = np.where(has, np.searchsorted(starts, c_tsc, "left") - 1, -1)
            t = ops["tsc"][sel].astype(np.int64)
            d = out.get(c_i)
            if d is None:
                d = out[c_i] = dict(ops=np.zeros(nu, np.int64), wrs=np.zeros(nu, np.int64),
                                    bytes=np.zeros(nu, np.int64), first=np.full(nu, _END, np.int64),
                                    last=np.full(nu, -1, np.int64), comp=np.full(nu, -1, np.int64),
                                    reach=np.full(nu, -1, np.int64))
            np.add.at(d["ops"], u, 1)
            np.minimum.at(d["first"], u, t)
            np.maximum.at(d["last"], u, t)
            np.maximum.at(d["comp"], u, c_tsc)
            np.maximum.at(d["reach"], u, reach)
            np.add.at(d["wrs"], u, ops["num_wr"][sel].astype(np.int64))
            np.add.at(d["bytes"], u, ops["bytes"][sel].astype(np.int64))
        return out

    def merge_units(self, parts):
        """The units from the per-operation statistics (``unit_stats`` of all operations, possibly in parts):
        a unit whose work completes after the next unit's call, or that moves data but posted nothing before
        it (its work came later), is merged with the next one.  Fills ``unit``, ``merged``, ``units`` and the
        per-unit totals."""
        self.unit = np.full(self.n, -1, np.int64)
        self.merged = np.zeros(self.n, bool)
        self.comm_qps = np.bincount(self.qp_comm[self.qp_comm >= 0], minlength=len(self.comms)) if self.comms else \
            np.zeros(0, np.int64)
        stats = {}
        for p in parts:
            for c_i, d in p.items():
                if c_i not in stats:
                    stats[c_i] = {k: v.copy() for k, v in d.items()}
                    continue
                s = stats[c_i]
                for k in ("ops", "wrs", "bytes"):
                    s[k] += d[k]
                s["first"] = np.minimum(s["first"], d["first"])
                for k in ("last", "comp", "reach"):
                    s[k] = np.maximum(s[k], d[k])
        units, self._gunit, self._gcid = [], {}, {}
        tot = dict(ops=[], wrs=[], bytes=[], first=[], last=[], comp=[])
        for c_i, (calls, src_unit, starts, _) in self._plan().items():
            c = self.comms[c_i]
            nu = len(starts)
            s = stats.get(c_i) or dict(ops=np.zeros(nu, np.int64), wrs=np.zeros(nu, np.int64),
                                       bytes=np.zeros(nu, np.int64), first=np.full(nu, _END, np.int64),
                                       last=np.full(nu, -1, np.int64), comp=np.full(nu, -1, np.int64),
                                       reach=np.full(nu, -1, np.int64))
            reach, n_in = s["reach"], s["ops"]
            moves = np.zeros(nu, bool)
            np.logical_or.at(moves, src_unit, (self.count[calls] * DT_SIZE[self.dt[calls] & 0xFF] > 0)
                             & (c["nranks"] > 1))
            empty = moves & (n_in == 0) & (self.comm_qps[c_i] > 0)
            merged_id = np.zeros(nu, np.int64)
            cur, hi, pending = 0, -1, False
            for k in range(nu):
                if k > 0 and not (pending or hi >= k):
                    cur += 1
                    hi = -1
                merged_id[k] = cur
                hi = max(hi, int(reach[k]))
                pending = bool(empty[k])
            base = len(units)
            for m in range(cur + 1):
                members = calls[merged_id[src_unit] == m]
                units.append(members)
                self.unit[members] = base + m
                if len(np.unique(src_unit[merged_id[src_unit] == m])) > 1:
                    self.merged[members] = True
                src = merged_id == m
                for k in ("ops", "wrs", "bytes"):
                    tot[k].append(int(s[k][src].sum()))
                tot["first"].append(int(s["first"][src].min()))
                tot["last"].append(int(s["last"][src].max()))
                tot["comp"].append(int(s["comp"][src].max()))
            single = np.array([len(units[x]) == 1 for x in range(base, len(units))], bool)
            cid = np.array([units[x][0] if len(units[x]) == 1 else -1 for x in range(base, len(units))], np.int64)
            self._gunit[c_i] = base + merged_id                       # unit before merging -> unit
            self._gcid[c_i] = np.where(single, cid, -1)[merged_id]    # -> the call, when the unit has one
        self.units = units
        self.u_ops, self.u_wrs, self.u_bytes = (np.array(tot[k], np.int64) for k in ("ops", "wrs", "bytes"))
        self.u_first, self.u_last, self.u_comp = (np.array(tot[k], np.int64) for k in ("first", "last", "comp"))
        self.u_first[self.u_first == _END] = -1

    def label_ops(self, ops, receiving=()):
        """(collective_id, collective_unit) of each operation (int32, -1 where not attributed), after
        ``merge_units``; ``receiving`` as for ``unit_stats``."""
        no = len(ops["tsc"])
        op_cid = np.full(no, -1, np.int32)
        op_unit = np.full(no, -1, np.int32)
        for c_i, sel, u, _ in self._op_units(ops, receiving):
            op_unit[sel] = self._gunit[c_i][u]
            op_cid[sel] = self._gcid[c_i][u]
        return op_cid, op_unit

    # ---- tables --------------------------------------------------------------------------------------------
    def attribution_labels(self):
        lab = np.array(["window"] * self.n, dtype=object)
        for k in range(self.n):
            if self.result[k] not in ACCEPTED:
                lab[k] = "refused"
            elif self.inst[k] < 0:
                lab[k] = "no-communicator"
            elif self.simulated[k]:
                lab[k] = "simulated"
            elif not self.comm_qps[self.inst[k]]:
                lab[k] = "no-qps"
            elif self.merged[k]:
                lab[k] = "in-flight"
            elif self.unit[k] >= 0 and len(self.units[self.unit[k]]) > 1:
                lab[k] = "group"
        return lab

    def tables(self, to_ns, proc_node, ranks):
        """(collectives, communicators) columns on the final time base, and the qps table's extra columns."""
        n = self.n
        p = self.process
        call_ns = to_ns(p, self.tsc) if n else np.zeros(0, np.int64)
        call_end = to_ns(p, (self.tsc.astype(np.int64) + self.dur).astype(np.uint64)) if n else np.zeros(0, np.int64)
        u = self.unit
        has_u = u >= 0
        uu = np.maximum(u, 0)

        def unit_ns(vals):
            v = vals[uu] if len(vals) else np.full(n, -1, np.int64)
            ok = has_u & (v >= 0)
            res = np.full(n, -1, np.int64)
            if ok.any():
                res[ok] = to_ns(p[ok], v[ok].astype(np.uint64))
            return res

        first_ns, last_ns, comp_ns = unit_ns(self.u_first), unit_ns(self.u_last), unit_ns(self.u_comp)
        end_ns = np.where(comp_ns >= 0, comp_ns, last_ns)
        dur_ns = np.where(end_ns >= 0, end_ns - call_ns, -1)
        rank = np.array([self.comms[i]["rank"] if i >= 0 else -1 for i in self.inst], np.int64) if n else \
            np.zeros(0, np.int64)
        nranks = np.array([self.comms[i]["nranks"] if i >= 0 else -1 for i in self.inst], np.int64) if n else \
            np.zeros(0, np.int64)
        # the cross-rank instance: its members, the rank that finished last, the rank that called last
        inst_ranks = np.zeros(n, np.int64)
        slowest = np.full(n, -1, np.int64)
        last_call = np.full(n, -1, np.int64)
        sel = np.flatnonzero(self.instance >= 0)
        if len(sel):
            ins = self.instance[sel]
            cnt = np.bincount(ins)
            inst_ranks[sel] = cnt[ins]
            for col, out_ in ((end_ns, slowest), (call_ns, last_call)):
                o = np.lexsort((rank[sel], -col[sel], ins))     # per instance: latest first, lowest rank on ties
                head = np.ones(len(o), bool)
                head[1:] = ins[o][1:] != ins[o][:-1]
                best = np.full(int(ins.max()) + 1, -1, np.int64)
                best[ins[o][head]] = rank[sel][o][head]
                good = np.full(int(ins.max()) + 1, True)
                if col is end_ns:                          # a member without a known end: no slowest rank
                    np.logical_and.at(good, ins, col[sel] >= 0)
                out_[sel] = np.where(good[ins], best[ins], -1)
        dt_name = np.array(list(DATATYPES) + [f"type{i}" for i in range(len(DATATYPES), 256)], dtype=object)
        wire = np.where(has_u, self.u_bytes[uu] if len(self.u_bytes) else 0, 0)
        coll = dict(
            collective_id=np.arange(n, dtype=np.int64), process=p, thread=self.thread,
            node=proc_node[p] if n else np.zeros(0, np.int64), rank=rank, nranks=nranks,
            comm=self.inst.copy(), comm_key=np.array([self.comms[i]["key"] if i >= 0 else "" for i in self.inst],
                                                     dtype=object),
            op=np.array([KINDS.get(int(k), f"kind{int(k)}") for k in self.kind], dtype=object),
            count=self.count, datatype=dt_name[self.dt & 0xFF] if n else np.zeros(0, object),
            bytes=self.count * DT_SIZE[self.dt & 0xFF], redop=np.array([redop_name(r) for r in self.redop], dtype=object),
            root=self.peer, seq=self.seq, instance=self.instance, call_ns=call_ns, call_duration_ns=call_end - call_ns,
            result=self.result, group=self.group, unit=u.copy(), attribution=self.attribution_labels(),
            wrs=np.where(has_u, self.u_wrs[uu] if len(self.u_wrs) else 0, 0).astype(np.int64),
            wire_bytes=wire.astype(np.int64), first_wr_ns=first_ns, last_wr_ns=last_ns,
            last_completion_ns=comp_ns, end_ns=end_ns, duration_ns=dur_ns, instance_ranks=inst_ranks,
            slowest_rank=slowest, last_call_rank=last_call)
        nc = len(self.comms)
        cp = np.array([c["process"] for c in self.comms], np.int64)
        t0 = np.array([c["t0"] for c in self.comms], np.uint64)
        d = np.array([c["dur"] for c in self.comms], np.int64)
        endt = np.array([c["end"] for c in self.comms], np.int64)
        init_ns = to_ns(cp, t0) if nc else np.zeros(0, np.int64)
        has_end = endt < _END
        end_c = np.full(nc, -1, np.int64)
        if has_end.any():
            end_c[has_end] = to_ns(cp[has_end], endt[has_end].astype(np.uint64))
        calls = np.bincount(self.inst[self.executed], minlength=nc).astype(np.int64) if nc else np.zeros(0, np.int64)
        comms = dict(
            comm=np.arange(nc, dtype=np.int64), process=cp, node=proc_node[cp] if nc else np.zeros(0, np.int64),
            rank=np.array([c["rank"] for c in self.comms], np.int64),
            nranks=np.array([c["nranks"] for c in self.comms], np.int64),
            key=np.array([c["key"] for c in self.comms], dtype=object),
            call=np.array([INIT_CALLS.get(c["variant"], "") for c in self.comms], dtype=object),
            init_ns=init_ns, init_duration_ns=(to_ns(cp, (t0.astype(np.int64) + d).astype(np.uint64)) - init_ns)
            if nc else np.zeros(0, np.int64), end_ns=end_c,
            cuda_dev=np.array([c["cuda_dev"] for c in self.comms], np.int64),
            qps=np.asarray(self.comm_qps, np.int64) if nc else np.zeros(0, np.int64), calls=calls)
        return coll, comms


def receiving_qps(post_recv, topo):
    """The QPs that posted receive work requests (IBV_POST_RECV records): the receiving ends of NCCL's net
    connections, whose work (the receive-buffer announcements) needs only their own rank's call."""
    if not len(post_recv["tsc"]) or not topo.n:
        return np.zeros(0, np.int64)
    q = topo.of(post_recv["process"].astype(np.int32), post_recv["qpn"])
    return np.unique(q[q >= 0]).astype(np.int64)


def empty_attribution(ops):
    """The ops' collective columns when the capture has no NCCL communicator."""
    no = len(ops["tsc"])
    ops["collective_id"] = np.full(no, -1, np.int32)
    ops["collective_unit"] = np.full(no, -1, np.int32)
