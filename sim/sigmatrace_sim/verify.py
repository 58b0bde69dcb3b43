"""Decode a capture with sigmatrace.format + sigmatrace.mlx5 (not the model's own
code) and compare it with the model's ground truth.  Used by the tests; also a
reference for what a correlator must be able to recover.
"""
import json
from collections import defaultdict

import numpy as np

from sigmatrace.format import read_capture
from sigmatrace import mlx5

from .cluster import truth_paths


def load_truth(capture_path):
    npz, js = truth_paths(capture_path)
    with np.load(npz) as z:
        arrays = {k: z[k] for k in z.files}
    with open(js) as f:
        meta = json.load(f)
    return arrays, meta


def decode(capture_path):
    """Doorbells and recovered WQEs per (rank, qpn), in recording order, decoded independently."""
    cap = read_capture(capture_path)
    rank_of = np.array([p.header["rank"] for p in cap.processes])
    db = cap.table("DB_DOORBELL")
    doorbells = defaultdict(list)
    ranks = rank_of[db["process"]]
    for r, q, pi, raw, tsc in zip(ranks, db["qpn"], db["producer_index"], db["raw"], db["tsc"]):
        d = mlx5.parse_doorbell(int(raw))
        doorbells[(int(r), int(q))].append((int(tsc), int(pi), d.producer_index, d.qpn))
    wq = cap.table("DB_WQE")
    wqes = defaultdict(list)
    for proc, q, first, sid in zip(wq["process"], wq["qpn"], wq["first_wqe_index"], wq["side_id"]):
        rec = cap.side_record(int(proc), int(sid))
        head, body = rec.wqe()
        off = 0
        idx = head["first_wqe_index"]
        while off < len(body):
            w = mlx5.parse_wqe(body, off)
            wqes[(int(rank_of[proc]), int(q))].append(dict(
                wqe_index=w.wqe_index, expected_index=idx, opcode=w.opcode, opmod=w.opmod, qpn=w.qpn,
                num_wqebb=w.num_wqebbs, bytes=w.total_bytes, raddr=w.raddr or 0, rkey=w.rkey or 0))
            off += w.num_wqebbs * 64
            idx = (idx + w.num_wqebbs) & 0xFFFF
    lost = cap.table("DB_WQE_LOST")
    return cap, doorbells, wqes, lost


def compare(capture_path):
    """Returns a dict of mismatches (empty lists when the decode reproduces the truth)."""
    arrays, meta = load_truth(capture_path)
    cap, doorbells, wqes, lost = decode(capture_path)
    problems = defaultdict(list)
    d = arrays["doorbells"]
    seen = d[d["recorded"] & ~d["coalesced"]]
    for key in set(doorbells) | set(zip(seen["rank"].tolist(), seen["qpn"].tolist())):
        r, q = key
        t = seen[(seen["rank"] == r) & (seen["qpn"] == q)]
        t = t[np.argsort(t["t_observed"], kind="stable")]
        got = doorbells.get(key, [])
        if len(got) != len(t):
            problems["doorbell_count"].append((key, len(got), len(t)))
            continue
        for (tsc, pi, dpi, dq), row in zip(got, t):
            if pi != row["pi16"] or dpi != row["pi16"] or dq != q:
                problems["doorbell"].append((key, pi, int(row["pi16"])))
    w = arrays["wqes"]
    rec = w[w["recovered"] == 1]
    per_qp, per_gpu = defaultdict(int), defaultdict(int)
    for key, got in wqes.items():
        r, q = key
        t = rec[(rec["rank"] == r) & (rec["qpn"] == q)]
        t = t[np.argsort(t["wqe_index"], kind="stable")]
        if len(got) != len(t):
            problems["wqe_count"].append((key, len(got), len(t)))
            continue
        for g, row in zip(got, t):
            want = (int(row["wqe_index16"]), int(row["opcode"]), int(row["bytes"]), int(row["raddr"]),
                    int(row["rkey"]), int(row["num_wqebb"]), q)
            have = (g["wqe_index"], g["opcode"], g["bytes"], g["raddr"], g["rkey"], g["num_wqebb"], g["qpn"])
            if want != have or g["wqe_index"] != g["expected_index"]:
                problems["wqe"].append((key, have, want))
            per_qp[key] += g["bytes"]
            per_gpu[r] += g["bytes"]
    for key in set(zip(rec["rank"].tolist(), rec["qpn"].tolist())) - set(wqes):
        problems["wqe_missing_qp"].append(key)
    # byte totals: decoded vs truth (recovered WQEs)
    for key, b in per_qp.items():
        m = (rec["rank"] == key[0]) & (rec["qpn"] == key[1])
        if int(rec["bytes"][m].sum()) != b:
            problems["qp_bytes"].append((key, b, int(rec["bytes"][m].sum())))
    for r, b in per_gpu.items():
        if int(rec["bytes"][rec["rank"] == r].sum()) != b:
            problems["gpu_bytes"].append((r, b))
    lost_truth = int((w["recovered"] == 0).sum())
    return {"problems": dict(problems), "doorbells": sum(len(v) for v in doorbells.values()),
            "wqes": sum(len(v) for v in wqes.values()), "lost_records": int(len(lost["qpn"])),
            "lost_truth_wqes": lost_truth, "per_qp_bytes": dict(per_qp), "per_gpu_bytes": dict(per_gpu)}
