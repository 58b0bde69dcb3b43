"""JSON aggregates (summary.json): per-QP bandwidth, per-GPU volume, rank and node matrices,
drops/losses, clock residuals, skew, barriers, NCCL collectives, time range."""
from __future__ import annotations

import json
import math

import numpy as np

from ..analysis import comm_matrix, latency_reduction, op_latency_groups, skew, wr_latency
from ..analysis.summable import rows as summed_rows
from ..analysis.summable import split_rest, summable
from ..correlate.collectives import KINDS
from ..format import layout as L
from ..mlx5.verbs import OPCODE_VOCAB
from ..query import connect, named_queries


def _clean(x):
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, np.ndarray):      # whole arrays at once: a 1,024-rank matrix is a million cells
        if x.dtype.kind in "iub":
            return x.tolist()
        if x.dtype.kind == "f":
            return np.where(np.isfinite(x), x.astype(object), None).tolist()
        return [_clean(v) for v in x.tolist()]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating, float)):
        f = float(x)
        return None if math.isnan(f) or math.isinf(f) else f
    if isinstance(x, (np.bool_,)):
        return bool(x)
    return x


def _rows(con, sql):
    cur = con.execute(sql)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def build_summary(corr, con=None, perfetto_stats=None, summed=None, latency=None):
    """summary.json of a report: ``corr``'s small tables, clocks, warnings and statistics; ``con``: the query
    engine over its tables (default: over ``corr``); ``summed``: the ``analysis.summable`` aggregates added up
    from the parts of the per-record tables (the cluster report's reduction: then nothing here reads the ops,
    doorbells or wqes rows), else they are queried here; ``latency``: an ``analysis.latency_reduction``
    already computed (the report computes it once for this and the latency figure; the cluster report from
    its parts), else it is queried here."""
    con = con or connect(corr)
    S = (lambda name: summed_rows(summed, name)) if summed is not None else (lambda name: summable(con, name))
    # the named queries that read ops through their ``part`` CTE (analysis.summable.SPLIT)
    Q = (lambda name: split_rest(con, name, summed)) if summed is not None else (lambda name: _rows(con, run_named_sql(name)))
    T = corr.tables
    # the per-record tables through the query engine (they need not be in this process: the cluster report)
    tot = S("totals")[0]
    n_ops, n_matched, n_bytes = tot["ops"], tot["matched"], tot["bytes"]
    dbc = S("doorbell_counts")[0]
    n_db, db_done, db_coalesced, db_lost = dbc["doorbells"], dbc["recovered"], dbc["coalesced"], dbc["lost_wqebbs"]
    n_events = int(corr.stats.get("events", 0))
    tr = corr.stats.get("time_range_ns")
    P = T["processes"]
    s = {
        "files": corr.files,
        "processes": int(len(P["process"])),
        "nodes": list(T["nodes"]["label"]),
        "ranks": sorted(int(r) for r in set(P["rank"].tolist()) if r >= 0),
        "events": n_events,
        "time_range_ns": [int(tr[0]), int(tr[1])] if n_events and tr else None,
        "duration_s": float((tr[1] - tr[0]) / 1e9) if n_events and tr else 0.0,
        "operations": int(n_ops),
        "operations_matched": int(n_matched),
        "unmatched": corr.stats.get("unmatched", {}),   # per library: operations, unmatched, reasons
        "bytes_total": int(n_bytes),
        "by_opcode": _by_opcode([(r["opcode"], r["ops"]) for r in S("by_opcode")]),
        "doorbells": {
            "total": int(n_db),
            "recovered": int(db_done),
            "coalesced": int(db_coalesced),
            "wqes": int(S("wqe_count")[0]["wqes"]),
        },
        "per_qp": [r for r in Q("qp_bandwidth") if r["ops"] > 0],
        "per_gpu": S("gpu_volume"),
    }
    for level in ("node", "rank", "gpu"):
        labels, m, c = comm_matrix(con, level, rows=S(f"matrix_{level}"))
        s[f"{level}_matrix"] = {"labels": labels, "bytes": m, "ops": c}
    s["skew"] = {"node": _labelled(skew(con, "node", rows=Q("skew_node")), list(T["nodes"]["label"]),
                                   ("heaviest_src", "heaviest_dst", "heaviest_egress_node", "heaviest_ingress_node")),
                 "gpu": _labelled(skew(con, "gpu", rows=Q("skew_gpu")), list(T["gpus"]["label"]),
                                  ("heaviest_src", "heaviest_dst", "heaviest_egress_gpu", "heaviest_ingress_gpu"))}
    s["top_talkers"] = Q("top_talkers")
    s["top_pairs"] = Q("top_pairs")
    B = T["barriers"]
    stragglers = _rows(con, run_named_sql("stragglers"))
    s["barriers"] = {
        "count": int(len(B["barrier"])),
        "worst": _rows(con, "SELECT barrier, instance, first_ns, spread_ns, straggler_label, straggler_rank, arrival_order "
                            "FROM barriers ORDER BY spread_ns DESC, barrier LIMIT 10"),
        "stragglers": stragglers,
        "most_often_last": _most_often_last(stragglers),
    }
    s["collectives"] = _collectives(con, T, tot["attributed"])
    L = T["losses"]
    s["losses"] = {
        "dropped_events": int(P["dropped_events"].sum()),
        "lost_bytes": int(L["bytes"][L["kind"] == "file"].sum()) if len(L["kind"]) else 0,
        "wqe_lost_wqebbs": int(db_lost),
        "incomplete_processes": [int(i) for i in np.flatnonzero(~P["complete"])],
        "ended_early": _ended_early(con, P),
        "items": _rows(con, "SELECT kind, process, path, bytes, count, detail FROM losses"),
    }
    C = T["clock"]
    s["clock"] = {"refinement": corr.clock_info,
                  "nodes": [dict(zip(C.keys(), vals)) for vals in zip(*C.values())]}
    # over the written table, where an unknown latency is NULL (no completion recorded): only measured ones count
    if latency is None:
        latency = latency_reduction(con, hist=False)
    s["wr_latency_ns"] = wr_latency(latency)
    s["latency"] = op_latency_groups(latency, hist=False)
    if perfetto_stats:
        s["perfetto"] = perfetto_stats
    s["untraced_libraries"] = [dict(e, notice=untraced_notice(e)) for e in corr.stats.get("untraced_libraries", [])]
    s["warnings"] = list(corr.warnings)
    return _clean(s)


def untraced_notice(e):
    """One line: which library some processes loaded untraced (format.reader.untraced_libraries), and what to
    do about it."""
    n = len(e["processes"])
    who = "1 process" if n == 1 else f"{n} processes"
    lib, prov = e["library"], e.get("provider") or "?"
    if e.get("reason") == L.UNTRACED_NOT_BUILT:
        return (f"{lib} was loaded by {who} but the tracer was built without the {prov} provider: its calls are not "
                f"in this trace; rebuild the tracer (pip install ., or bash .ci/install) and trace again")
    on = e.get("enabled")
    sel = f"--providers {','.join(on) if on else 'none'}" if isinstance(on, list) else "--providers"
    return (f"{lib} was loaded by {who} but the {prov} provider was disabled ({sel}): its calls are not in "
            f"this trace; trace again with {prov} in --providers (or --providers all)")


def _collectives(con, T, attributed):
    """NCCL: calls and communicators, how the calls' work requests were attributed, and per kind and size
    (named query ``collectives``) the bytes on the wire, call → end times and the slowest rank; aggregate
    mode: the NCCL_COLL counters (calls and bytes per kind).  None without NCCL calls."""
    C = T.get("collectives")
    A = T["aggregates"]
    agg = np.asarray(A["type_name"], dtype=object) == "NCCL_COLL" if len(A["type_name"]) else np.zeros(0, bool)
    if (C is None or not len(C["collective_id"])) and not agg.any():
        return None
    out = {"calls": 0, "executed": 0, "communicators": int(len(T["communicators"]["comm"])), "attribution": {},
           "by_kind": [], "shared_units": []}
    if C is not None and len(C["collective_id"]):
        out["calls"] = int(len(C["collective_id"]))
        out["executed"] = int((C["seq"] >= 0).sum())
        labs, cnt = np.unique(np.asarray(C["attribution"], dtype=str), return_counts=True)
        out["attribution"] = {str(k): int(v) for k, v in zip(labs, cnt)}
        out["qps"] = int((T["qps"]["comm"] >= 0).sum()) if "comm" in T["qps"] else 0
        out["ops_attributed"] = int(attributed)
        out["by_kind"] = _rows(con, run_named_sql("collectives"))
        out["shared_units"] = _rows(con, """
            SELECT unit, any_value(attribution) AS attribution, any_value(rank) AS rank, any_value(comm) AS comm,
                   string_agg(op, '+' ORDER BY collective_id) AS ops, count(*) AS calls, sum(bytes) AS bytes,
                   any_value(wrs) AS wrs, any_value(wire_bytes) AS wire_bytes, any_value(duration_ns) AS duration_ns
            FROM collectives WHERE attribution IN ('group', 'in-flight') GROUP BY unit ORDER BY unit LIMIT 50""")
    if agg.any():
        kinds = np.asarray(A["aux"])[agg] & 0xFF
        rows = {}
        for k, c, b in zip(kinds.tolist(), np.asarray(A["count"])[agg].tolist(), np.asarray(A["bytes"])[agg].tolist()):
            r = rows.setdefault(KINDS.get(int(k), f"kind{k}"), {"calls": 0, "bytes": 0})
            r["calls"] += int(c)
            r["bytes"] += int(b)
        out["aggregate"] = [{"op": k, **v} for k, v in sorted(rows.items())]
    return out


def _ended_early(con, P):
    """The processes whose file has no END (killed, or cut): who they were and the time of their last recorded
    event, so that a reader sees which rank stopped and when."""
    early = [int(i) for i in np.flatnonzero(~P["complete"])]
    if not early:
        return []
    last = dict(con.execute("SELECT process, max(ns) FROM events WHERE process IN (%s) GROUP BY process"
                            % ",".join(map(str, early))).fetchall())
    return [{"process": i, "pid": int(P["pid"][i]), "rank": int(P["rank"][i]), "path": str(P["path"][i]),
             "last_event_ns": None if last.get(i) is None else int(last[i])} for i in early]


def _labelled(sk, labels, keys):
    """The skew dict with ``<key>_label`` for each id column (node / GPU ids are dense indices of ``labels``)."""
    for k in keys:
        v = sk.get(k)
        if v is not None and 0 <= int(v) < len(labels):
            sk[f"{k}_label"] = str(labels[int(v)])
    return sk


def _most_often_last(stragglers):
    """The participants last at the most barrier instances ({"times_last", "labels", "ranks", "instances"}),
    or None without barriers; ``unique`` False when several share that count."""
    if not stragglers:
        return None
    top = stragglers[0]["times_last"]
    tied = [r for r in stragglers if r["times_last"] == top]
    return {"times_last": int(top), "labels": [r["straggler_label"] for r in tied],
            "ranks": [r["straggler_rank"] for r in tied], "unique": len(tied) == 1,
            "instances": int(sum(r["times_last"] for r in stragglers)),
            "total_spread_ns": int(sum(r["total_spread_ns"] for r in tied))}


def _by_opcode(counts):
    """{opcode name: operations} from (mlx5 opcode, count) rows."""
    cnt = {}
    for k, v in counts:
        cnt[OPCODE_VOCAB[int(k)]] = cnt.get(OPCODE_VOCAB[int(k)], 0) + int(v)
    return {k: cnt[k] for k in sorted(cnt)}


def run_named_sql(name):
    return named_queries()[name].strip().rstrip(";")


def _json_lines(x, depth, pad):
    """``x`` as JSON, a dict's members one per line (indented by one space a level) for the first ``depth``
    levels, everything below compact: json's C encoder does the bulk (it is not used with ``indent``, and a
    1,024-rank matrix written one number per line took seconds of the driver's time)."""
    if isinstance(x, dict) and x and depth > 0:
        inner = pad + " "
        items = [f"{inner}{json.dumps(str(k))}: {_json_lines(v, depth - 1, inner)}" for k, v in x.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    return json.dumps(x, default=str)


def write_summary(summary, path):
    with open(path, "w") as f:
        f.write(_json_lines(summary, 3, ""))
        f.write("\n")
