"""sigmatrace.mlx5 against bytes made by rdma-core's own inline helpers and structs.

native/tests/mlx5_vectors.c is compiled here against the installed
<infiniband/mlx5dv.h>; it writes WQEs (every opcode of ref §2.1), send-queue
rings with wrap, CQEs, doorbells and PRM command buffers, each with the values it
used.  Every record is decoded field by field and rebuilt with the Python encoders,
which must reproduce the vendor bytes exactly.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from sigmatrace import mlx5
from sigmatrace.mlx5 import Opcode

pytestmark = pytest.mark.sim

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "native" / "tests" / "mlx5_vectors.c"
HEADER = Path("/usr/include/infiniband/mlx5dv.h")
BYTES_KEYS = {"hex", "inline", "payload"}
STRING_KEYS = {"amo", "convention"}


def _value(key: str, text: str):
    if key in BYTES_KEYS:
        return bytes.fromhex(text)
    if key in STRING_KEYS:
        return text
    if key.startswith("sge"):
        return tuple(int(part, 0) for part in text.split(":"))
    return int(text, 0)


def _parse_line(line: str):
    kind, name, *pairs = line.split()
    params = {}
    for pair in pairs:
        key, _, text = pair.partition("=")
        params[key] = _value(key, text)
    return kind, name, params


@pytest.fixture(scope="module")
def vectors(tmp_path_factory):
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc not found on PATH: cannot build native/tests/mlx5_vectors.c")
    if not HEADER.exists():
        pytest.skip(f"{HEADER} missing: install the rdma-core headers (Debian: libibverbs-dev)")
    exe = tmp_path_factory.mktemp("mlx5_vectors") / "mlx5_vectors"
    build = subprocess.run([gcc, "-std=gnu11", "-O1", "-Wall", "-Wextra", "-Werror", "-I/usr/include",
                            "-o", str(exe), str(SOURCE)], capture_output=True, text=True)
    assert build.returncode == 0, f"mlx5_vectors.c failed to compile:\n{build.stderr}"
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=30, check=True)
    records = [_parse_line(line) for line in run.stdout.splitlines() if line.strip()]
    assert records, "the generator printed nothing"
    return records


def _of(vectors, kind):
    return [(name, p) for k, name, p in vectors if k == kind]


def _sgl(p):
    return [p[k] for k in sorted((k for k in p if k.startswith("sge")), key=lambda k: int(k[3:]))]


def _expected_total(p) -> int:
    """Bytes the operation moves, derived from the generator's parameters (not the decoder)."""
    if "amo" in p:
        return 4 if p["amo"] == "masked_4b" else 8
    if "inline" in p:
        return len(p["inline"])
    if "payload" in p or p["opcode"] == Opcode.NOP:
        return 0
    return sum(bc for bc, _, _ in _sgl(p))


def _check_wqe(w: mlx5.WQE, name: str, p: dict) -> None:
    where = f"{name}:"
    assert (w.opcode, w.opmod, w.wqe_index, w.qpn, w.ds) == \
        (p["opcode"], p["opmod"], p["idx"], p["qpn"], p["ds"]), where
    assert w.opcode_name == Opcode(p["opcode"]).name, where
    assert (w.fm_ce_se, w.signature, w.imm) == (p["fm_ce_se"], p["signature"], p["imm"]), where
    assert w.fence_mode == p["fm_ce_se"] >> 5, where
    assert w.completion_mode == (p["fm_ce_se"] >> 2) & 3, where
    assert w.solicited == bool(p["fm_ce_se"] & 2), where
    assert w.num_wqebbs == -(-p["ds"] // 4), where
    assert (w.raddr, w.rkey) == ((p["raddr"], p["rkey"]) if "raddr" in p else (None, None)), where
    assert w.data_segments == _sgl(p), where
    assert w.inline_data == p.get("inline"), where
    assert w.total_bytes == _expected_total(p), where
    if "payload" in p:
        assert not w.segments_decoded and w.payload == p["payload"], where
    else:
        assert w.segments_decoded and w.payload is None, where
    if "amo" not in p:
        assert w.atomic is None, where
        return
    a = w.atomic
    is_cs = p["opcode"] in (Opcode.ATOMIC_CS, Opcode.ATOMIC_MASKED_CS)
    assert a.size == (4 if p["amo"] == "masked_4b" else 8), where
    assert a.swap_add == p["swap_add"], where
    if p["amo"] == "plain":
        assert a.compare == (p["compare"] if is_cs else None), where
        assert a.swap_add_mask is None and a.compare_mask is None, where
    elif p["amo"] == "masked_generic" or is_cs:
        assert (a.compare, a.swap_add_mask, a.compare_mask) == \
            (p["compare"], p["swap_add_mask"], p["compare_mask"]), where
    else:  # masked FA with a field boundary
        assert a.field_boundary == p["field_boundary"] and a.compare is None, where


def _build_from_params(p: dict, pad: bool = False) -> bytes:
    kwargs = dict(sgl=_sgl(p), imm=p["imm"], fm_ce_se=p["fm_ce_se"], signature=p["signature"], pad=pad)
    if "raddr" in p:
        kwargs.update(raddr=p["raddr"], rkey=p["rkey"])
    if "inline" in p:
        kwargs["inline"] = p["inline"]
    if "payload" in p:
        kwargs["payload"] = p["payload"]
    if "amo" in p:
        kwargs.update(swap_add=p["swap_add"], compare=p["compare"], swap_add_mask=p["swap_add_mask"],
                      compare_mask=p["compare_mask"], field_boundary=p["field_boundary"])
        if p["amo"].startswith("masked"):
            kwargs["opmod"] = p["opmod"]
    if p["opcode"] == Opcode.NOP:
        kwargs["ds"] = p["ds"]
    return mlx5.build_wqe(p["opcode"], p["idx"], p["qpn"], **kwargs)


def test_every_reference_opcode_is_covered(vectors):
    covered = {p["opcode"] for _, p in _of(vectors, "wqe")}
    assert covered == {int(op) for op in Opcode}, sorted(set(map(int, Opcode)) - covered)


def test_covers_inline_atomic_and_multi_wqebb_forms(vectors):
    wqes = [p for _, p in _of(vectors, "wqe")]
    assert any("inline" in p for p in wqes)
    kinds = {(p["amo"], -(-p["ds"] // 4)) for p in wqes if "amo" in p}
    assert {("plain", 1), ("masked_4b", 1), ("masked_8b", 1), ("masked_8b", 2)} <= kinds
    assert {p["opmod"] for p in wqes if "amo" in p} >= {0x00, 0x08, 0x09}
    assert any(p["idx"] == 0xFFFF for p in wqes)


def test_wqes_decode_field_by_field(vectors):
    for name, p in _of(vectors, "wqe"):
        _check_wqe(mlx5.parse_wqe(p["hex"]), name, p)
        # a WQE not at offset 0 of a larger buffer decodes the same
        w = mlx5.parse_wqe(bytes(64) + p["hex"] + bytes(64), 64)
        assert w.offset == 64 and w.wqe_index == p["idx"], name


def test_python_encoder_reproduces_rdma_core_bytes(vectors):
    for name, p in _of(vectors, "wqe"):
        c_bytes = p["hex"]
        assert mlx5.build_ctrl(p["opcode"], p["idx"], p["qpn"], p["ds"], p["fm_ce_se"], p["opmod"],
                               p["imm"], p["signature"]) == c_bytes[:16], name
        assert _build_from_params(p) == c_bytes, name
        padded = _build_from_params(p, pad=True)
        assert len(padded) == 64 * -(-p["ds"] // 4) and padded[:len(c_bytes)] == c_bytes, name
        assert not any(padded[len(c_bytes):]), name


def test_rings_walk_across_index_and_ring_wrap(vectors):
    rings = _of(vectors, "ring")
    assert {name for name, _ in rings} == {"wrap8", "inline_wrap4"}
    for name, ring in rings:
        expected = [(n.split(".", 1)[1], p) for n, p in _of(vectors, "ringwqe") if n.startswith(name + ".")]
        result = mlx5.walk_send_queue(ring["hex"], ring["log_sq_size"], ring["from_pi"], ring["to_pi"])
        assert result.ok and result.complete, (name, result.problems)
        assert len(result.wqes) == len(expected), name
        nslots = 1 << ring["log_sq_size"]
        for w, (wname, p) in zip(result.wqes, expected):
            _check_wqe(w, f"{name}.{wname}", p)
            assert w.slot == p["idx"] & (nslots - 1)
        # the Python encoder + ring writer rebuilds the vendor ring byte for byte
        rebuilt = bytearray(len(ring["hex"]))
        for _, p in expected:
            mlx5.write_wqe_to_ring(rebuilt, ring["log_sq_size"], p["idx"], _build_from_params(p, pad=True))
        assert bytes(rebuilt) == ring["hex"], name
    wrap8 = dict(expected for expected in _of(vectors, "ringwqe"))
    crossing = wrap8["wrap8.masked_cs_8b"]
    assert crossing["idx"] == 0xFFFF and crossing["ds"] == 5   # 2 WQEBBs: slot 7 then slot 0


def test_rdma_core_doorbells_name_the_last_wqe(vectors):
    for name, p in _of(vectors, "db"):
        if p["convention"] != "rdma-core":
            continue
        for form in (p["hex"], p["u64"]):
            db = mlx5.parse_doorbell(form)
            assert (db.producer_index, db.qpn, db.opcode, db.ds) == (p["pi"], p["qpn"], p["opcode"], p["ds"]), name
            assert db.names_last_wqe and db.convention == "rdma-core"
            assert db.end_index == p["end"], name
            assert db.value == p["u64"] and db.raw == p["hex"]
        assert mlx5.doorbell_bytes(p["pi"], p["qpn"], "rdma-core", opcode=p["opcode"], opmod=p["opmod"],
                                   ds=p["ds"]) == p["hex"], name
        assert mlx5.doorbell_value(p["pi"], p["qpn"], "rdma-core", opcode=p["opcode"], opmod=p["opmod"],
                                   ds=p["ds"]) == p["u64"], name


def test_gpu_doorbells_nvshmem_and_doca(vectors):
    seen = set()
    for name, p in _of(vectors, "db"):
        conv = p["convention"]
        if conv == "rdma-core":
            continue
        seen.add(conv)
        from_bytes, from_u64 = mlx5.parse_doorbell(p["hex"]), mlx5.parse_doorbell(p["u64"])
        assert from_bytes == from_u64, name
        assert from_bytes.producer_index == p["pi"] & 0xFFFF == p["end"], name
        assert from_bytes.end_index == p["end"] and not from_bytes.names_last_wqe, name
        assert from_bytes.qpn == p["qpn"], name
        assert from_bytes.byte0 == ((p["pi"] >> 16) & 0xFF if conv == "doca" else 0), name
        assert mlx5.doorbell_bytes(p["pi"], p["qpn"], conv) == p["hex"], name
        assert mlx5.doorbell_value(p["pi"], p["qpn"], conv) == p["u64"], name
    assert seen == {"nvshmem", "doca"}


def test_doorbell_records(vectors):
    dbrs = _of(vectors, "dbr")
    assert dbrs
    for name, p in dbrs:
        assert mlx5.dbr_bytes(p["pi"]) == p["hex"], name
        assert mlx5.parse_dbr(p["hex"]) == p["pi"] & 0xFFFF, name
        assert mlx5.parse_dbr(int.from_bytes(p["hex"], "little")) == p["pi"] & 0xFFFF, name


def test_cqes(vectors):
    cqes = _of(vectors, "cqe")
    assert {p["opcode"] for _, p in cqes} >= {0, 3, 13, 14, 15}
    for name, p in cqes:
        c = mlx5.parse_cqe(p["hex"])
        assert (c.opcode, c.owner, c.format, c.se) == (p["opcode"], p["owner"], p["format"], p["se"]), name
        assert (c.qpn, c.send_opcode, c.wqe_counter) == (p["qpn"], p["send_opcode"], p["wqe_counter"]), name
        assert (c.user_index, c.signature) == (p["user_index"], p["signature"]), name
        assert c.opcode_name == mlx5.CqeOpcode(p["opcode"]).name
        if "syndrome" in p:
            assert c.is_error and (c.syndrome, c.vendor_err_synd) == (p["syndrome"], p["vendor_err_synd"]), name
            assert c.syndrome_name == mlx5.CqeSyndrome(p["syndrome"]).name
            assert c.byte_cnt is None and c.timestamp is None
        else:
            assert not c.is_error and c.syndrome is None, name
            assert (c.byte_cnt, c.timestamp) == (p["byte_cnt"], p["timestamp"]), name
            if "imm" in p:
                assert c.imm_inval_pkey == p["imm"]
        if name == "invalid_ff_c3":
            continue   # a fill pattern, not an encoded CQE
        rebuilt = mlx5.build_cqe(
            p["opcode"], qpn=p["qpn"], wqe_counter=p["wqe_counter"], send_opcode=p["send_opcode"],
            owner=p["owner"], se=p["se"], format=p["format"], signature=p["signature"],
            user_index=p["user_index"], byte_cnt=p.get("byte_cnt", 0), timestamp=p.get("timestamp", 0),
            imm_inval_pkey=p.get("imm", 0), syndrome=p.get("syndrome", 0),
            vendor_err_synd=p.get("vendor_err_synd", 0))
        assert rebuilt == p["hex"], name


_PRM = {
    "prm_create_qp_in": (mlx5.CREATE_QP_IN_FIELDS, lambda b: mlx5.parse_create_qp(b),
                         lambda f: mlx5.build_create_qp_in(**f)),
    "prm_create_qp_out": (mlx5.CREATE_QP_OUT_FIELDS, None, lambda f: mlx5.build_create_qp_out(**f)),
    "prm_modify_qp_in": (mlx5.MODIFY_QP_IN_FIELDS, lambda b: mlx5.parse_modify_qp(b),
                         lambda f: mlx5.build_modify_qp_in(f.pop("opcode"), f.pop("qpn"), **f)),
    "prm_create_cq_in": (mlx5.CREATE_CQ_IN_FIELDS, lambda b: mlx5.parse_create_cq(b),
                         lambda f: mlx5.build_create_cq_in(size=len(f.pop("_hex")), **f)),
}


def test_prm_buffers_follow_the_devx_bit_rule(vectors):
    """Buffers written with the header's _devx_set/_devx_set64 read back through the Python
    field tables, and the Python builders write the same bytes."""
    seen = set()
    for kind, name, p in vectors:
        if kind not in _PRM:
            continue
        seen.add(kind)
        table, parse, build = _PRM[kind]
        buf = p["hex"]
        assert len(buf) == p["size"]
        values = {k: v for k, v in p.items() if k not in ("hex", "size")}
        for field, value in values.items():
            f = table[field]
            assert mlx5.prm_get(buf, f.bit_offset, f.width) == value, (kind, name, field)
        if parse is not None:
            decoded = parse(buf)
            for field, value in values.items():
                assert getattr(decoded, field) == value, (kind, name, field)
        built = build({**values, "_hex": buf} if kind == "prm_create_cq_in" else dict(values))
        assert built == buf, (kind, name)
    assert seen == set(_PRM)


def test_create_qp_out_pairs_with_in(vectors):
    qp_in = next(p for k, _, p in vectors if k == "prm_create_qp_in")
    qp_out = next(p for k, _, p in vectors if k == "prm_create_qp_out")
    qp = mlx5.parse_create_qp(qp_in["hex"], qp_out["hex"])
    assert qp.qpn == qp_out["qpn"] and qp.status == 0
    # rq_type 0 (regular RQ) with 2^10 entries of 16 B: the SQ follows the RQ (ref §4.3)
    assert qp.rq_size_bytes == (1 << qp_in["log_rq_size"]) * 16
    assert qp.sq_offset == qp_in["wq_umem_offset"] + (1 << qp_in["log_rq_size"]) * 16
    assert qp.sq_size_bytes == (1 << qp_in["log_sq_size"]) * 64
    mod = mlx5.parse_modify_qp(next(p for k, n, p in vectors if k == "prm_modify_qp_in" and n == "init2rtr")["hex"])
    assert mod.transition == "INIT2RTR" and mod.mtu_bytes == 4096
