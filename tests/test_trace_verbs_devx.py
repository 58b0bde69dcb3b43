"""The mlx5dv/DevX provider traced inside the IBGDA-style CPU client.

native/tests/emu_ibgda_client performs the NVSHMEM setup sequence over DevX
(UAR, umems, CQ, QP, RST2INIT/INIT2RTR/RTR2RTS) and then writes WQEs into its
own send queue.  The tracer's mlx5 events must describe its QPs exactly as
the client itself reports them: CREATE_QP PRM buffers re-parse (with
sigmatrace.mlx5.parse_create_qp) to the QPN, log_sq_size and uar_page the
client logs, and INIT2RTR carries the peer's QPN.
"""
import re
import subprocess

import numpy as np
import pytest

import sigmatrace.mlx5 as M

from native_util import needs_emu
from test_trace_verbs_support import IBGDA_CLIENT, capture, env_for, needs_mlx5_provider, needs_tracer

pytestmark = [pytest.mark.sim, needs_emu, needs_tracer, needs_mlx5_provider,
              pytest.mark.skipif(IBGDA_CLIENT is None, reason="emu_ibgda_client not built (native/tests)")]

SETUP = re.compile(r"SETUP lid=(\d+) qpn=(0x[0-9a-f]+) cqn=(0x[0-9a-f]+) sq_wqebb=(\d+) uar_page=(\d+)")


def setups(stdout):
    return [dict(lid=int(a), qpn=int(b, 16), cqn=int(c, 16), sq_wqebb=int(d), uar_page=int(e))
            for a, b, c, d, e in SETUP.findall(stdout)]


def devx_qps(cap, proc):
    """{qpn: parsed CREATE_QP} and {qpn: [parsed modify commands]} of one process, from PRM side records."""
    cr, mo = cap.table("MLX5_DEVX_OBJ_CREATE"), cap.table("MLX5_DEVX_OBJ_MODIFY")
    created = {}
    for k in np.flatnonzero((cr["process"] == proc) & (cr["prm_opcode"] == 0x500)):
        rec = cap.side_record(proc, cr["side_id"][k])
        assert rec is not None and rec.kind == 3, "CREATE_QP without its PRM_COMMAND side record"
        in_buf, out_buf = rec.prm()
        q = M.parse_create_qp(in_buf, out_buf)
        assert q.qpn == int(cr["number"][k]), "event obj is the QPN of create_qp_out"
        assert int(cr["status"][k]) == 0 and int(cr["handle"][k]) != 0
        created[q.qpn] = q
    mods = {}
    for k in np.flatnonzero(mo["process"] == proc):
        in_buf, _ = cap.side_record(proc, mo["side_id"][k]).prm()
        m = M.parse_modify_qp(in_buf)
        assert m.qpn == int(mo["qpn"][k]), "modify event obj is the QPN in the command"
        mods.setdefault(m.qpn, []).append(m)
    return created, mods


def check_process(cap, proc, stdout, peer_of):
    created, mods = devx_qps(cap, proc)
    st = setups(stdout)
    assert sorted(created) == sorted(s["qpn"] for s in st)
    uar, umem = cap.table("MLX5_DEVX_ALLOC_UAR"), cap.table("MLX5_DEVX_UMEM_REG")
    pages = set(uar["page_id"][uar["process"] == proc].tolist())
    umems = {int(i): (int(a), int(s)) for i, a, s, p in
             zip(umem["umem_id"], umem["addr"], umem["size"], umem["process"]) if p == proc}
    assert (umem["umem_flags"][umem["process"] == proc] == 0).all(), "host memory reported as GPU"
    for s in st:
        q = created[s["qpn"]]
        assert q.log_sq_size == s["sq_wqebb"].bit_length() - 1
        assert q.sq_wqebbs == s["sq_wqebb"]
        assert q.uar_page == s["uar_page"] and q.uar_page in pages, "uar_page is an allocated UAR"
        assert q.wq_umem_valid and q.wq_umem_id in umems, "SQ lives in a registered umem"
        assert q.dbr_umem_valid and q.dbr_umem_id in umems
        assert umems[q.wq_umem_id][1] >= q.sq_offset + q.sq_size_bytes
        # RST2INIT -> INIT2RTR(remote_qpn = peer) -> RTR2RTS
        seq = [m.transition for m in mods[s["qpn"]]]
        assert seq == ["RST2INIT", "INIT2RTR", "RTR2RTS"], seq
        rtr = mods[s["qpn"]][1]
        assert rtr.remote_qpn == peer_of[s["qpn"]], "INIT2RTR carries the peer's QPN"
    # the CQs: CREATE_CQ out buffer gives the cqn the client logs
    cr = cap.table("MLX5_DEVX_OBJ_CREATE")
    cqns = set(cr["number"][(cr["process"] == proc) & (cr["prm_opcode"] == 0x400)].tolist())
    assert {s["cqn"] for s in st} <= cqns
    assert len(cap.table("MLX5_DEVX_QUERY_EQN")["eqn"]) >= 1


def test_ibgda_client_pair_traced(fabric, tmp_path):
    r = subprocess.run([str(IBGDA_CLIENT), "--pair", "--depth", "64", "--ops", "200", "--batch", "5"],
                       env=env_for(fabric, 0x31, tmp_path, "full"), capture_output=True, text=True, timeout=25)
    assert r.returncode == 0 and "RESULT OK" in r.stdout, r.stdout[-2000:] + r.stderr
    cap = capture(tmp_path)
    st = setups(r.stdout)
    assert len(st) == 2
    a, b = st[0]["qpn"], st[1]["qpn"]
    check_process(cap, 0, r.stdout, {a: b, b: a})
    # the verbs objects of the same setup (PD, SRQ, recv CQ, data MR) come from the ibv provider
    c = cap.count_by_type()
    assert c["IBV_OPEN_DEVICE"] == 1 and c["IBV_CREATE_SRQ"] >= 1 and c["IBV_REG_MR"] >= 1


def test_ibgda_client_two_processes_traced(fabric, tmp_path):
    d = tmp_path / "rdv"
    d.mkdir()
    out = tmp_path / "trace"
    common = ["--dir", str(d), "--depth", "32", "--ops", "150", "--batch", "7"]
    target = subprocess.Popen([str(IBGDA_CLIENT), "--rank", "1"] + common, env=env_for(fabric, 0x41, out, "simple"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        init = subprocess.run([str(IBGDA_CLIENT), "--rank", "0"] + common, env=env_for(fabric, 0x42, out, "simple"),
                              capture_output=True, text=True, timeout=25)
        tout, terr = target.communicate(timeout=25)
    finally:
        if target.poll() is None:
            target.kill()
            target.communicate()
    assert init.returncode == 0, init.stdout[-2000:] + init.stderr
    assert target.returncode == 0, tout[-2000:] + terr
    cap = capture(out)
    assert len(cap.processes) == 2
    con = re.compile(r"CONNECT local lid=(\d+) qpn=(0x[0-9a-f]+) remote lid=(\d+) qpn=(0x[0-9a-f]+)")
    by_lid = {p.header["nics"][0]["ports"][0]["lid"]: p.index for p in cap.processes}
    for stdout in (init.stdout, tout):
        llid, lqpn, rlid, rqpn = con.search(stdout).groups()
        check_process(cap, by_lid[int(llid)], stdout, {int(lqpn, 16): int(rqpn, 16)})
