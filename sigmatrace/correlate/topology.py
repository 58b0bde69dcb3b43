"""QP topology: every local QP (process, qpn) and the remote QP it is connected to, across processes and nodes.

QPs come from verbs creation records (IBV_CREATE_QP), DevX CREATE_QP PRM commands (qpn, SQ size, UAR page,
service type) and, without a creation record, from the doorbells / WQEs / work requests that name them
("implicit").  The remote side comes from the recorded transitions: IBV_MODIFY_QP (dest_qpn, dlid, dgid in
the side JSON) and DevX INIT2RTR (remote_qpn, rlid, rgid).  A remote QPN is resolved to a traced QP through
the NIC that owns the remote GID, else the remote LID, else — no hardware address recorded — a QP with that
number on another process whose own remote is this QP ("mutual-qpn").
"""
from __future__ import annotations

import numpy as np

from .. import mlx5
from ..mlx5.errors import Mlx5DecodeError
from ..mlx5.verbs import IBV_QPS_RTR
from .identity import Nics, norm_gid
from .util import pq_key

# PRM opcodes (ref §3): CREATE_QP and the QP state transitions that carry the remote address
PRM_CREATE_QP = 0x500
IBV_QPT_UD, PRM_ST_UD = 4, 0x2   # verbs qp_type / PRM qpc.st of a UD QP
PRM_QP_TRANSITIONS = (0x502, 0x503, 0x504, 0x505)      # RST2INIT, INIT2RTR, RTR2RTS, RTS2RTS

# what a malformed PRM command record raises when parsed (counted and reported, never fatal); anything
# else is a bug and propagates
_PRM_ERRORS = (Mlx5DecodeError, ValueError, KeyError)


class Topology:
    """QP rows keyed by (process, qpn), numbered in key order (``qp_id``), and each QP's remote QP."""

    def __init__(self, out, st, procs, nics: Nics, records):
        """``records``: the DB_DOORBELL, DB_WQE, IBV_SEND_WR, IBV_POST_SEND, IBV_WR_COMPLETE columns (QPs they
        name without a creation record become implicit QPs)."""
        self.nics = nics
        self.qp = {}
        bad_prm = self._created(st, procs)
        bad_prm += self._transitions(st, procs)
        if bad_prm:
            out.warnings.append(f"{bad_prm} DevX PRM command record(s) could not be decoded")
        for t in records:
            if len(t["tsc"]):
                for k in np.unique(pq_key(t["process"], t["qpn"])):
                    self.row(int(k >> 32), int(k & 0xFFFFFFFF))
        self.keys = sorted(self.qp)
        for i, key in enumerate(self.keys):
            self.qp[key]["qp_id"] = i
        self.n = n = len(self.keys)
        self.process = np.array([self.qp[k]["process"] for k in self.keys], np.int64)
        self.qpn = np.array([self.qp[k]["qpn"] for k in self.keys], np.int64)
        self.nic = np.array([self.qp[k]["nic"] for k in self.keys], np.int64)
        self.key = pq_key(self.process, self.qpn) if n else np.zeros(0, np.int64)
        self.ids = np.arange(n, dtype=np.int64)
        self.remote, self.resolved_by = self._resolve(out)
        self.ah_nic = self._address_handles(st, procs)

    # ---- UD: the destination of each datagram ---------------------------------------------------------
    def _port_nic(self, gid, lid):
        """The traced NIC a datagram's address names: by its GID when it has one, else by its LID; -1: none."""
        nic = self.nics.by_gid.get(norm_gid(gid)) if gid is not None else None
        if nic is None and lid:
            nic = self.nics.by_lid.get(int(lid))
        return -1 if nic is None else int(nic)

    def _qp_at(self, nic, qpn):
        """qp_id of QP ``qpn`` on traced NIC ``nic``, -1 when none (or ambiguous)."""
        cand = self.by_nic_qpn.get((nic, int(qpn) & 0xFFFFFF)) if nic >= 0 else None
        return cand[0] if cand and len(cand) == 1 else -1

    def _address_handles(self, st, procs):
        """(process, address-handle id) -> the NIC its GID (else LID) names; -1 when no traced NIC has it."""
        t = st.table("IBV_CREATE_AH")
        res = {}
        for k in range(len(t["tsc"])):
            pi = int(t["process"][k])
            js = procs[pi].side_json.get(int(t["side_id"][k]))
            js = js if isinstance(js, dict) else {}
            res[(pi, int(t["ah"][k]))] = self._port_nic(js.get("dgid") if js.get("is_global") else None,
                                                        js.get("dlid"))
        return res

    def datagram_dest_av(self, rgid, rlid, dqpn):
        """qp_id of the destination of one datagram a QP wrote itself (UCX ud_mlx5, DevX): its WQE's address
        vector names the port (GID when it carries one, else LID) and the QPN; -1 when no traced QP is there."""
        return self._qp_at(self._port_nic(int.from_bytes(rgid, "big") if rgid else None, rlid), dqpn)

    def datagram_dest(self, proc, ah, rqpn):
        """qp_id of each datagram's destination QP -- the remote QPN of its work request on the NIC its address
        handle names -- or -1 (no address handle recorded, its port is no traced NIC's, or no traced QP there)."""
        out = np.full(len(proc), -1, np.int64)
        if not len(proc) or not self.ah_nic:
            return out
        memo = {}
        for i, key in enumerate(zip(np.asarray(proc).tolist(), np.asarray(ah).tolist(), np.asarray(rqpn).tolist())):
            q = memo.get(key)
            if q is None:
                q = memo[key] = self._qp_at(self.ah_nic.get((key[0], key[1]), -1), key[2])
            out[i] = q
        return out

    # ---- rows ---------------------------------------------------------------------------------------
    def row(self, pi, qpn):
        key = (pi, qpn)
        if key not in self.qp:
            self.qp[key] = dict(process=pi, qpn=qpn, nic=self.nics.nic_for(pi, None), kind="implicit", qp_type=-1,
                                log_sq_size=-1, uar_page=-1, remote_qpn=-1, rlid=0, rgid=None, sq_sig_all=False,
                                create_tsc=0, create_thread=-1)
        return self.qp[key]

    def rows(self):
        """QP rows in qp_id order."""
        return [self.qp[k] for k in self.keys]

    def row_at(self, i):
        return self.qp[self.keys[i]]

    def ud_mask(self):
        """Per QP: a UD QP (verbs IBV_QPT_UD or DevX st UD), whose WQEs carry a datagram address vector."""
        if getattr(self, "_ud", None) is None:
            self._ud = np.array([(r.get("kind") == "verbs" and r.get("qp_type") == IBV_QPT_UD) or
                                 (r.get("kind") == "devx" and r.get("qp_type") == PRM_ST_UD) for r in self.rows()], bool)
        return self._ud

    def sig_all_mask(self):
        """Per QP: created with sq_sig_all (every work request signaled)."""
        if getattr(self, "_sig_all", None) is None:
            self._sig_all = np.array([r["sq_sig_all"] for r in self.rows()], bool)
        return self._sig_all

    def _created(self, st, procs):
        create_qp_records = st.table("IBV_CREATE_QP")
        for k in range(len(create_qp_records["tsc"])):
            pi, qpn = int(create_qp_records["process"][k]), int(create_qp_records["qpn"][k])
            js = procs[pi].side_json.get(int(create_qp_records["side_id"][k]))
            r = self.row(pi, qpn)
            r.update(kind="verbs", qp_type=int(create_qp_records["qp_type"][k]), nic=self.nics.nic_for(pi, js),
                     create_tsc=int(create_qp_records["tsc"][k]), create_thread=int(create_qp_records["thread"][k]))
            if isinstance(js, dict):
                r["sq_sig_all"] = bool(js.get("sq_sig_all", False))
        devx_create = st.table("MLX5_DEVX_OBJ_CREATE")
        bad_prm = 0
        for k in np.flatnonzero(devx_create["prm_opcode"] == PRM_CREATE_QP):
            pi = int(devx_create["process"][k])
            rec = procs[pi].side_prm.get(int(devx_create["side_id"][k]))
            qpn = int(devx_create["number"][k])
            parsed = None
            if rec is not None:
                try:
                    parsed = mlx5.parse_create_qp(rec[0], rec[1] if len(rec[1]) >= 16 else None)
                except _PRM_ERRORS:
                    bad_prm += 1
            if parsed is not None and parsed.qpn:
                qpn = int(parsed.qpn)
            r = self.row(pi, qpn)
            r.update(kind="devx", create_tsc=int(devx_create["tsc"][k]), create_thread=int(devx_create["thread"][k]))
            if parsed is not None:
                r.update(log_sq_size=int(parsed.log_sq_size), uar_page=int(parsed.uar_page), qp_type=int(parsed.st))
                if parsed.remote_qpn:
                    r["remote_qpn"] = int(parsed.remote_qpn)
        return bad_prm

    def _transitions(self, st, procs):
        modify_qp_records = st.table("IBV_MODIFY_QP")
        m = modify_qp_records
        for k in np.flatnonzero((m["dest_qpn"] != 0) | (m["state"] == IBV_QPS_RTR)):
            pi, qpn = int(m["process"][k]), int(m["qpn"][k])
            r = self.row(pi, qpn)
            if m["dest_qpn"][k] or m["state"][k] == IBV_QPS_RTR:
                r["remote_qpn"] = int(m["dest_qpn"][k])
                r["rlid"] = int(m["dlid"][k])
            js = procs[pi].side_json.get(int(m["side_id"][k]))
            if isinstance(js, dict):
                g = js.get("dgid") or js.get("remote_gid") or js.get("rgid")
                if g:
                    r["rgid"] = norm_gid(g)
                if js.get("dest_qp_num") is not None and not r["remote_qpn"] > 0:
                    r["remote_qpn"] = int(js["dest_qp_num"])
        devx_modify = st.table("MLX5_DEVX_OBJ_MODIFY")
        bad_prm = 0
        for k in range(len(devx_modify["tsc"])):
            if int(devx_modify["prm_opcode"][k]) not in PRM_QP_TRANSITIONS:
                continue
            pi = int(devx_modify["process"][k])
            rec = procs[pi].side_prm.get(int(devx_modify["side_id"][k]))
            if rec is None:
                continue
            try:
                mp = mlx5.parse_modify_qp(rec[0])
            except _PRM_ERRORS:
                bad_prm += 1
                continue
            qpn = int(mp.qpn or devx_modify["qpn"][k])
            r = self.row(pi, qpn)
            if mp.transition == "INIT2RTR" or (mp.remote_qpn or 0):
                if mp.remote_qpn is not None:
                    r["remote_qpn"] = int(mp.remote_qpn)
                if mp.rlid:
                    r["rlid"] = int(mp.rlid)
                if mp.grh and mp.rgid_rip:
                    r["rgid"] = norm_gid(int(mp.rgid_rip))
        return bad_prm

    # ---- lookups ------------------------------------------------------------------------------------
    def of(self, proc_arr, qpn_arr):
        """qp_id of each (process, qpn); -1 where unknown.  ``key`` is sorted (the keys are): one searchsorted."""
        if not self.n or not len(qpn_arr):
            return np.full(len(qpn_arr), -1, np.int64)
        k = pq_key(proc_arr, qpn_arr)
        pos = np.minimum(np.searchsorted(self.key, k), self.n - 1)
        return np.where(self.key[pos] == k, pos, -1)

    def _resolve(self, out):
        qp, keys = self.qp, self.keys
        by_nic_qpn, by_qpn = {}, {}
        for key in keys:
            r = qp[key]
            by_nic_qpn.setdefault((r["nic"], r["qpn"]), []).append(r["qp_id"])
        self.by_nic_qpn = by_nic_qpn
        for key in keys:
            by_qpn.setdefault(qp[key]["qpn"], []).append(qp[key]["qp_id"])
        remote = np.full(self.n, -1, np.int64)
        how = np.array([""] * self.n, dtype=object)
        unresolved = 0
        for key in keys:
            r = qp[key]
            rq = r["remote_qpn"]
            if rq is None or rq < 0 or (r["kind"] == "verbs" and r["qp_type"] == 4):
                continue     # unconnected, or UD (IBV_QPT_UD: its RTR carries no destination)
            i = r["qp_id"]
            cand = None
            if r["rgid"]:
                nic = self.nics.by_gid.get(r["rgid"])
                if nic is not None:
                    cand = by_nic_qpn.get((nic, rq))
                    how[i] = "gid"
            if cand is None and r["rlid"]:
                nic = self.nics.by_lid.get(r["rlid"])
                if nic is not None:
                    cand = by_nic_qpn.get((nic, rq))
                    how[i] = "lid"
            if not cand:
                # no hardware address recorded (or not resolvable): a QP with that number whose own
                # remote is this QP's number, on another process
                c = [j for j in by_qpn.get(rq, []) if self.process[j] != r["process"]
                     and qp[keys[j]]["remote_qpn"] == r["qpn"]]
                if len(c) > 1:
                    c = [j for j in c if self.nic[j] != r["nic"]] or c
                if len(c) == 1:
                    cand = c
                    how[i] = "mutual-qpn"
                elif len(c) > 1:
                    out.warnings.append(f"QP {r['qpn']:#x} of process {r['process']}: remote QPN {rq:#x} is ambiguous "
                                        f"({len(c)} candidates, no GID/LID recorded)")
            if cand:
                remote[i] = cand[0]
            else:
                unresolved += 1
                how[i] = "unresolved"
        if unresolved:
            out.warnings.append(f"{unresolved} connected QP(s) have a remote QPN that matches no traced QP "
                                f"(peer process not traced or its file missing)")
        return remote, how

    # ---- table --------------------------------------------------------------------------------------
    def table(self, node_of, ranks, qp_gpu):
        n, remote, proc = self.n, self.remote, self.process
        rows = self.rows()
        far = np.maximum(remote, 0)
        empty = np.zeros(0, np.int64)
        return dict(
            qp_id=self.ids, process=proc, node=node_of[proc] if n else empty,
            rank=ranks[proc] if n else empty, gpu=qp_gpu, qpn=self.qpn, nic=self.nic,
            kind=np.array([r["kind"] for r in rows], dtype=object),
            qp_type=np.array([r["qp_type"] for r in rows], np.int64),
            log_sq_size=np.array([r["log_sq_size"] for r in rows], np.int64),
            uar_page=np.array([r["uar_page"] for r in rows], np.int64),
            remote_qpn=np.array([r["remote_qpn"] for r in rows], np.int64),
            rlid=np.array([r["rlid"] for r in rows], np.int64),
            rgid=np.array([r["rgid"] or "" for r in rows], dtype=object),
            remote_qp_id=remote, resolved_by=self.resolved_by,
            remote_process=np.where(remote >= 0, proc[far], -1) if n else empty,
            remote_node=np.where(remote >= 0, node_of[proc[far]], -1) if n else empty,
            remote_rank=np.where(remote >= 0, ranks[proc[far]], -1) if n else empty,
            remote_gpu=np.where(remote >= 0, qp_gpu[far], -1) if n else empty,
        )
