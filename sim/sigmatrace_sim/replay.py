"""Replay (F14): re-run a capture's doorbell stream through the model's send-queue
and producer-index semantics, check invariants and answer what-if questions.

Works on any capture (model or native): it needs DB_DOORBELL records, and for the
WQE checks DB_WQE / DB_WQE_LOST and the CREATE_QP PRM records (SQ depth).

Invariants, per QP (process, QPN), in recording order:
  non_monotonic_pi     a doorbell's 16-bit PI is behind the previous one
                       ((pi - prev) mod 2^16 > 2^15)
  pi_jump_exceeds_sq   one doorbell advances by more than the SQ depth (WQEs
                       would have been overwritten before the NIC saw them)
  wqe_index_gap        recovered/lost WQE ranges do not continue where the previous
                       one ended, or a recovered WQE's ctrl wqe_index is not its slot's
  wqe_uncovered        WQEBBs announced by doorbells with neither DB_WQE nor DB_WQE_LOST
                       (recovery enabled only)
What-if (open loop: the recorded doorbell store times are kept; the GPU is not
slowed down or sped up by the new settings):
  store time of each observed doorbell ~= observation time - recorded wake-up;
  a poller with wake-up W observes max(store + W, poller free), coalescing every
  store it finds; recovery batches flush at `batch_threshold` WQEBBs, the copy reads
  the ring copy_latency later, and every WQEBB older than (highest PI stored by then
  - queue_depth) has been overwritten.  queue_depth defaults to each QP's SQ depth.
"""
from collections import defaultdict

import numpy as np

from sigmatrace.errors import TraceFormatError
from sigmatrace.format import read_capture
from sigmatrace.mlx5 import parse_create_qp, parse_wqe
from sigmatrace.progress import QUIET

from .params import Timing


def _sq_depths(cap):
    depth = {}
    oc = cap.table("MLX5_DEVX_OBJ_CREATE")
    for proc, op, num, sid in zip(oc["process"], oc["prm_opcode"], oc["number"], oc["side_id"]):
        if int(op) != 0x500:
            continue
        rec = cap.side_record(int(proc), int(sid))
        if rec is None:
            continue
        i, o = rec.prm()
        qp = parse_create_qp(i, o)
        depth[(int(proc), int(num))] = int(qp.sq_wqebbs)
    return depth


class QueueReplay:
    """The model's SQ producer-index arithmetic, driven by a recorded doorbell stream."""

    def __init__(self, depth):
        self.depth = depth
        self.pi = None        # full (extended) producer index
        self.problems = []

    def doorbell(self, pi16, k):
        delta = (pi16 - self.pi) & 0xFFFF
        first = self.pi
        if delta > 0x8000:
            self.problems.append(("non_monotonic_pi", k, self.pi & 0xFFFF, pi16))
            return 0, first
        if self.depth and delta > self.depth:
            self.problems.append(("pi_jump_exceeds_sq", k, self.pi & 0xFFFF, pi16))
        self.pi += delta
        return delta, first


def analyse(path, batch_threshold=None, queue_depth=None, poller_wakeup_ns=None, copy_latency_ns=None, timing=None,
            progress=QUIET):
    """(Capture, report).  Damaged input is read as the correlator reads it: corrupt spans and bad JSON
    chunks become warnings (``report["warnings"]``); a capture with no process data at all raises
    TraceFormatError.  ``progress`` (sigmatrace.progress) counts the QPs replayed."""
    cap = read_capture(path, errors="recover")
    if not cap.processes:
        raise TraceFormatError("no process data could be read from the capture", path)
    tm = timing or Timing()
    depth_of = _sq_depths(cap)
    db = cap.table("DB_DOORBELL")
    wq = cap.table("DB_WQE")
    lost = cap.table("DB_WQE_LOST")
    report = {"capture": str(path), "qps": 0, "doorbells": int(len(db["tsc"])), "violations": [],
              "recorded": {}, "what_if": {},
              "warnings": list(dict.fromkeys(list(cap.warnings) + [
                  f"{l.path}: lost {l.nbytes} bytes at offset {l.offset}: {l.reason}" for l in cap.losses]))}
    procs = cap.processes
    opts = [(p.header or {}).get("options", {}) for p in procs]
    hz = [float((p.header or {}).get("tsc_hz") or 1e9) for p in procs]
    rec_thr = [int(o.get("batch_threshold", 128)) for o in opts]
    rec_wake = [float(o.get("poller_wakeup_ns", tm.poller_wakeup_ns) or tm.poller_wakeup_ns) for o in opts]
    recovery = [bool(o.get("wqe_recovery", True)) for o in opts]
    blocking = [not bool(o.get("nonblocking", False)) for o in opts]
    thr_new = batch_threshold
    wake_new = poller_wakeup_ns
    copy_lat = tm.copy_latency_ns if copy_latency_ns is None else copy_latency_ns

    # group per QP
    groups = defaultdict(list)
    for k in range(len(db["tsc"])):
        groups[(int(db["process"][k]), int(db["qpn"][k]))].append(k)
    wgroups = defaultdict(list)
    for k in range(len(wq["tsc"])):
        wgroups[(int(wq["process"][k]), int(wq["qpn"][k]))].append(("wqe", k, int(wq["tsc"][k])))
    for k in range(len(lost["tsc"])):
        wgroups[(int(lost["process"][k]), int(lost["qpn"][k]))].append(("lost", k, int(lost["tsc"][k])))

    # put each QP's ranges in producer order: records of one batch share a TSC, so chain them
    def rng_of(item):
        kind, k, _ = item
        if kind == "wqe":
            h, _b = cap.side_record(int(wq["process"][k]), int(wq["side_id"][k])).wqe()
            return h["first_wqe_index"], h["num_wqebb"]
        return int(lost["first_wqe_index"][k]), int(lost["num_wqebb"][k])

    for key, items in wgroups.items():
        items.sort(key=lambda x: x[2])
        ordered, i = [], 0
        while i < len(items):
            j = i
            while j < len(items) and items[j][2] == items[i][2]:
                j += 1
            group = [(it, *rng_of(it)) for it in items[i:j]]
            ends = {(f + n) & 0xFFFF for _, f, n in group}
            starts = [g for g in group if g[1] not in ends] or group[:1]
            by_first = {g[1]: g for g in group}
            cur = starts[0]
            seen = set()
            while cur is not None and id(cur) not in seen:
                seen.add(id(cur))
                ordered.append(cur[0])
                cur = by_first.get((cur[1] + cur[2]) & 0xFFFF)
            ordered.extend(g[0] for g in group if id(g) not in seen)
            i = j
        wgroups[key] = ordered

    totals = defaultdict(float)
    progress("replay", 0, total=len(groups), unit="QP")
    for (proc, qpn), idxs in sorted(groups.items()):
        progress("replay", 1)
        report["qps"] += 1
        depth = depth_of.get((proc, qpn))
        qr = QueueReplay(depth)
        ws = wgroups.get((proc, qpn), [])
        if ws:   # where recovery starts: the first recovered/lost range (the QP may predate recording)
            kind, k0, _ = ws[0]
            qr.pi = int(wq["first_wqe_index"][k0]) if kind == "wqe" else int(lost["first_wqe_index"][k0])
        else:
            qr.pi = 0          # a QP created inside the capture starts at producer index 0
        order = sorted(idxs, key=lambda k: int(db["tsc"][k]))
        t0 = int(db["tsc"][order[0]])
        t_obs, firsts, deltas, pis = [], [], [], []
        for k in order:
            delta, first = qr.doorbell(int(db["producer_index"][k]), k)
            t_obs.append((int(db["tsc"][k]) - t0) / hz[proc] * 1e9)
            firsts.append(first)
            deltas.append(delta)
            pis.append(first + delta)
        for p in qr.problems:
            report["violations"].append({"kind": p[0], "process": proc, "qpn": qpn, "record": int(p[1]),
                                         "previous_pi": p[2], "pi": p[3]})
        # WQE ranges: recovered and lost, in recording order, must tile the announced ranges
        announced = sum(deltas)
        covered = 0
        expect = firsts[0] & 0xFFFF if firsts else None
        recorded_lost = 0
        for kind, k, _ in wgroups.get((proc, qpn), []):
            if kind == "wqe":
                rec = cap.side_record(proc, int(wq["side_id"][k]))
                head, body = rec.wqe()
                first = head["first_wqe_index"]
                n = head["num_wqebb"]
                off, idx = 0, first
                while off < len(body):
                    w = parse_wqe(body, off)
                    if w.wqe_index != idx:
                        report["violations"].append({"kind": "wqe_index_gap", "process": proc, "qpn": qpn,
                                                     "expected": idx, "found": w.wqe_index})
                    idx = (idx + w.num_wqebbs) & 0xFFFF
                    off += w.num_wqebbs * 64
            else:
                first = int(lost["first_wqe_index"][k])
                n = int(lost["num_wqebb"][k])
                recorded_lost += n
            if expect is not None and first != expect:
                report["violations"].append({"kind": "wqe_index_gap", "process": proc, "qpn": qpn,
                                             "expected": expect, "found": first})
            expect = (first + n) & 0xFFFF
            covered += n
        if recovery[proc] and wgroups.get((proc, qpn)) is not None and covered != announced:
            report["violations"].append({"kind": "wqe_uncovered", "process": proc, "qpn": qpn,
                                         "announced": announced, "covered": covered})
        totals["recorded_lost_wqebb"] += recorded_lost
        # what-if re-simulation
        for label, thr, wake, dep in (("recorded", rec_thr[proc], rec_wake[proc], depth),
                                      ("what_if", thr_new if thr_new is not None else rec_thr[proc],
                                       wake_new if wake_new is not None else rec_wake[proc],
                                       queue_depth if queue_depth is not None else depth)):
            r = _resimulate(np.array(t_obs) - rec_wake[proc], np.array(pis), np.array(firsts), thr, wake, dep,
                            copy_lat, tm, recovery[proc], blocking[proc])
            for key, v in r.items():
                if key.endswith("_max"):
                    totals[f"{label}.{key}"] = max(totals[f"{label}.{key}"], v)
                else:
                    totals[f"{label}.{key}"] += v
    for key, v in totals.items():
        if "." in key:
            label, name = key.split(".", 1)
            report[label][name] = v
        else:
            report["recorded"][key] = v
    for label in ("recorded", "what_if"):
        n = report[label].get("observations", 0) + report[label].get("coalesced", 0)
        if n:
            report[label]["forward_delay_mean_ns"] = report[label].pop("forward_delay_sum_ns") / n
    report["settings"] = {"batch_threshold": thr_new, "queue_depth": queue_depth,
                          "poller_wakeup_ns": wake_new, "copy_latency_ns": copy_lat}
    # nothing to check is not a clean bill: a capture without doorbells says so
    report["checked"] = report["doorbells"] > 0
    report["clean"] = (report["checked"] and not report["violations"]
                       and report["what_if"].get("predicted_lost_wqebb", 0) == 0)
    return cap, report


def _resimulate(t_store, pis, firsts, thr, wake, depth, copy_lat, tm, recovery, blocking=True):
    """Open-loop poller + recovery re-simulation over one QP's store stream."""
    n = len(t_store)
    out = {"observations": 0, "coalesced": 0, "forward_delay_sum_ns": 0.0, "forward_delay_max": 0.0,
           "predicted_lost_wqebb": 0, "batches": 0}
    if n == 0:
        return out
    busy_until = -1e18
    k = 0
    last_pi = firsts[0]
    pending = []
    pend_n = 0
    thr = max(1, int(thr))
    per_obs = tm.poller_record_ns + tm.poller_forward_ns + (tm.recovery_enqueue_ns if recovery and blocking else 0.0)
    helper_free = -1e18
    reads = []   # (t_read, batch)
    while k < n:
        t_seen = max(t_store[k] + wake, busy_until)
        j = k
        while j + 1 < n and t_store[j + 1] <= t_seen:
            j += 1
        out["observations"] += 1
        out["coalesced"] += j - k
        cost = per_obs
        if recovery and pis[j] > last_pi:
            pending.append((last_pi, pis[j] - last_pi))
            pend_n += pis[j] - last_pi
            if pend_n >= thr:
                copy = copy_lat + pend_n * 64 / tm.copy_bw
                if blocking:
                    reads.append((t_seen + copy, pending))
                    cost += copy + tm.parse_ns_per_wqe * pend_n
                else:   # a helper thread copies; batches queue behind each other
                    start = max(t_seen, helper_free)
                    reads.append((start + copy, pending))
                    helper_free = start + copy + tm.parse_ns_per_wqe * pend_n
                pending, pend_n = [], 0
                out["batches"] += 1
        last_pi = max(last_pi, pis[j])
        t_fwd = t_seen + cost
        for i in range(k, j + 1):
            d = t_fwd - t_store[i]
            out["forward_delay_sum_ns"] += d
            out["forward_delay_max"] = max(out["forward_delay_max"], d)
        busy_until = t_fwd
        k = j + 1
    if depth:
        for t_read, batch in reads:
            head = pis[np.searchsorted(t_store, t_read, side="right") - 1] if t_read >= t_store[0] else pis[0]
            for first, m in batch:
                out["predicted_lost_wqebb"] += int(max(0, min(m, head - depth - first)))
    return out


def format_report(rep):
    lines = [f"replay {rep['capture']}: {rep['qps']} QPs, {rep['doorbells']} doorbells"]
    if rep["violations"]:
        kinds = defaultdict(int)
        for v in rep["violations"]:
            kinds[v["kind"]] += 1
        lines.append("  invariant violations: " + ", ".join(f"{k}={n}" for k, n in sorted(kinds.items())))
        for v in rep["violations"][:10]:
            lines.append(f"    {v}")
    elif not rep.get("checked", True):
        lines.append("  invariants: not checked — the capture holds no doorbells (no GPU- or CPU-rung mlx5 "
                     "doorbells were traced: nothing to replay)")
    else:
        lines.append("  invariants: producer index monotonic, WQE indices continuous, all WQEBBs accounted for")
    for label in ("recorded", "what_if"):
        r = rep[label]
        if not r:
            continue
        lines.append(f"  {label:9s}: observations={int(r.get('observations', 0))} coalesced={int(r.get('coalesced', 0))} "
                     f"batches={int(r.get('batches', 0))} forward delay mean={r.get('forward_delay_mean_ns', 0):.0f} ns "
                     f"max={r.get('forward_delay_max', 0):.0f} ns predicted lost WQEBBs={int(r.get('predicted_lost_wqebb', 0))}"
                     + (f" (recorded lost {int(r['recorded_lost_wqebb'])})" if "recorded_lost_wqebb" in r else ""))
    for w in rep.get("warnings", [])[:10]:
        lines.append(f"  warning: {w}")
    s = rep["settings"]
    lines.append("  what-if settings: " + ", ".join(f"{k}={v}" for k, v in s.items() if v is not None))
    return "\n".join(lines)
