"""Trace format v1: round trip, truncation at every byte, corruption fuzzing."""
import io
import random

import numpy as np
import pytest

from sigmatrace import TraceFormatError
from sigmatrace.format import (
    CALIBRATION_DTYPE,
    EVENT_DTYPE,
    SIDE_JSON,
    SIDE_WQE_BYTES,
    TraceWriter,
    read_capture,
)
from sigmatrace.format import events as E
from sigmatrace.format import layout as L

pytestmark = pytest.mark.sim


def make_process(uid, n_events=500, threads=(1, 2), chunk_records=64, end=True, host="node0"):
    """Bytes of one process file with known content; returns (bytes, expected)."""
    buf = io.BytesIO()
    w = TraceWriter(buf, process_uid=uid, chunk_records=chunk_records)
    w.process({"format_version": 1, "host": host, "pid": uid & 0xFFFF, "rank": uid & 7, "tsc_hz": 2.0e9})
    expected = {}
    rng = np.random.default_rng(uid)
    for t in threads:
        w.thread(t, tid=1000 + t, name=f"t{t}", role="app")
        ev = np.zeros(n_events, EVENT_DTYPE)
        ev["tsc"] = np.cumsum(rng.integers(1, 100, n_events))
        ev["type"] = E.value("IBV_SEND_WR")
        ev["type"][1::2] = E.EXT  # every WR carries its EXT record
        ev["aux"] = rng.integers(0, 1 << 16, n_events)
        ev["obj"] = rng.integers(0, 1 << 24, n_events)
        ev["arg"] = rng.integers(0, 1 << 62, n_events, dtype=np.uint64)
        w.events(t, ev)
        expected[t] = ev
    cal = np.zeros(2, CALIBRATION_DTYPE)
    cal["tsc_before"] = [10, 1_000_000]
    cal["tsc_after"] = [12, 1_000_002]
    cal["realtime_ns"] = [5, 500_005]
    cal["point"] = [L.CALIB_START, L.CALIB_END]
    w.calibration(cal)
    sid = w.side_json({"qpn": 7})
    wsid = w.side_wqe(7, 0xFFFF, 6, bytes(range(64)) * 2)
    if end:
        w.end({"reason": "exit", "dropped_events": 0})
    w.close()
    return buf.getvalue(), dict(events=expected, side=sid, wqe_side=wsid, calibration=cal)


def test_round_trip_two_processes_concatenated(tmp_path):
    a, ea = make_process(0xA1)
    b, eb = make_process(0xB2, threads=(1, 2, 3), host="node1")
    path = tmp_path / "capture.bin"
    path.write_bytes(a + b)
    cap = read_capture(path)
    assert [p.uid for p in cap.processes] == [0xA1, 0xB2]
    assert not cap.losses and not cap.warnings
    for pi, exp in ((0, ea), (1, eb)):
        proc = cap.processes[pi]
        assert proc.complete
        assert set(proc.threads) == set(exp["events"])
        for t, ev in exp["events"].items():
            got = cap.events[(cap.event_process == pi) & (cap.event_thread == t)]
            np.testing.assert_array_equal(got, ev)
        np.testing.assert_array_equal(proc.calibration, exp["calibration"])
        assert proc.side[exp["side"]].json() == {"qpn": 7}
        head, body = proc.side[exp["wqe_side"]].wqe()
        assert head["first_wqe_index"] == 0xFFFF and head["num_wqebb"] == 2 and body == bytes(range(64)) * 2


def test_table_joins_ext_fields(tmp_path):
    data, exp = make_process(0x77, threads=(1,))
    (tmp_path / "p.trace").write_bytes(data)
    cap = read_capture(tmp_path)
    t = cap.table("IBV_SEND_WR")
    ev = exp["events"][1]
    prim, ext = ev[0::2], ev[1::2]
    np.testing.assert_array_equal(t["wr_id"], prim["arg"])
    np.testing.assert_array_equal(t["opcode"], prim["aux"] & 0xFF)
    np.testing.assert_array_equal(t["send_flags"], prim["aux"] >> 8)
    np.testing.assert_array_equal(t["raddr"], ext["tsc"])
    np.testing.assert_array_equal(t["rkey"], ext["obj"])
    np.testing.assert_array_equal(t["bytes"], ext["arg"])


def test_writer_never_splits_ext_from_its_record():
    buf = io.BytesIO()
    w = TraceWriter(buf, process_uid=1, chunk_records=3)
    ev = np.zeros(10, EVENT_DTYPE)
    ev["type"] = [0x0111, E.EXT, 0x0111, E.EXT, E.EXT, 0x0111, 0x0111, E.EXT, 0x0111, E.EXT]
    w.events(1, ev)
    from sigmatrace.format import iter_chunks

    path = io.BytesIO(buf.getvalue())
    chunks = list(iter_chunks("mem", data=path.getvalue()))
    firsts = [int.from_bytes(bytes(c.payload[8:10]), "little") for c in chunks]
    assert E.EXT not in firsts
    assert sum(c.count for c in chunks) == 10


def test_truncation_at_every_byte_keeps_complete_chunks(tmp_path):
    data, _ = make_process(0x55, n_events=40, threads=(1,), chunk_records=8)
    # chunk boundaries of the intact file
    from sigmatrace.format import iter_chunks

    bounds = [c.offset for c in iter_chunks("x", data=data)] + [len(data)]
    p = tmp_path / "cut.trace"
    for cut in range(len(data) + 1):
        p.write_bytes(data[:cut])
        if cut == 0:  # an empty file holds nothing and loses nothing
            cap = read_capture(p)
            assert not cap.processes and not cap.losses
            continue
        cap = read_capture(p)
        complete = max(b for b in bounds if b <= cut)
        assert cap.lost_bytes == cut - complete
        expected_records = sum(c.count for c in iter_chunks("x", data=data[:complete]) if c.kind == L.CHUNK_EVENTS)
        assert len(cap.events) == expected_records


def test_random_corruption_decodes_or_raises_documented_error(tmp_path):
    a, _ = make_process(0x11, n_events=60, chunk_records=16)
    b, _ = make_process(0x22, n_events=60, chunk_records=16)
    data = a + b
    rng = random.Random(1234)
    p = tmp_path / "fuzz.bin"
    outcomes = {"ok": 0, "error": 0}
    for case in range(3000):
        buf = bytearray(data)
        mode = case % 4
        if mode == 0:  # flip random bits
            for _ in range(rng.randint(1, 8)):
                buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        elif mode == 1:  # overwrite a random span with random bytes
            i = rng.randrange(len(buf))
            buf[i : i + rng.randint(1, 64)] = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 64)))
        elif mode == 2:  # huge length fields
            i = rng.randrange(0, len(buf) - 4)
            buf[i : i + 4] = rng.choice([b"\xff\xff\xff\xff", b"\x00\x00\x00\x80", b"\xf8\xff\xff\x00"])
        else:  # truncate and corrupt
            buf = buf[: rng.randrange(len(buf))]
            if buf:
                buf[rng.randrange(len(buf))] ^= 0xFF
        p.write_bytes(bytes(buf))
        for errors in ("raise", "recover"):
            try:
                cap = read_capture(p, errors=errors)
                cap.summary()
                outcomes["ok"] += 1
            except TraceFormatError as e:
                assert e.path == str(p) and (e.offset is None or 0 <= e.offset <= len(buf))
                assert errors == "raise" or e.offset is None or "JSON" in str(e) or "version" in str(e)
                outcomes["error"] += 1
    assert outcomes["ok"] > 100 and outcomes["error"] > 100


def test_recover_mode_skips_a_corrupt_chunk_and_reports_it(tmp_path):
    a, _ = make_process(0x11, n_events=64, threads=(1,), chunk_records=16)
    buf = bytearray(a)
    from sigmatrace.format import iter_chunks

    ev_chunks = [c for c in iter_chunks("x", data=a) if c.kind == L.CHUNK_EVENTS]
    victim = ev_chunks[1]
    buf[victim.offset + 40] ^= 0x01  # a payload bit: CRC mismatch
    p = tmp_path / "bad.trace"
    p.write_bytes(bytes(buf))
    with pytest.raises(TraceFormatError) as ei:
        read_capture(p)
    assert ei.value.offset == victim.offset and "CRC" in str(ei.value)
    cap = read_capture(p, errors="recover")
    assert len(cap.events) == 64 - victim.count
    assert cap.losses[0].offset == victim.offset and cap.losses[0].nbytes == 32 + 24 * victim.count


def test_other_version_is_a_clear_error(tmp_path):
    import struct
    import zlib

    head = struct.pack("<IHHQIIII", L.MAGIC, 2, L.CHUNK_EVENTS, 1, 1, 0, 0, 0)[:28]
    crc = zlib.crc32(head) & 0xFFFFFFFF
    p = tmp_path / "v2.trace"
    p.write_bytes(head + struct.pack("<I", crc))
    with pytest.raises(TraceFormatError, match="version 2"):
        read_capture(p)


def test_not_a_capture_and_missing_paths(tmp_path):
    p = tmp_path / "hello.trace"
    p.write_bytes(b"hello world, this is not a trace file at all....")
    with pytest.raises(TraceFormatError, match="not a sigmatrace capture"):
        read_capture(p)
    with pytest.raises(TraceFormatError, match="no such"):
        read_capture(tmp_path / "missing.bin")
    empty = tmp_path / "emptydir"
    empty.mkdir()
    with pytest.raises(TraceFormatError, match="no capture files"):
        read_capture(empty)


def test_duplicate_process_file_is_read_once(tmp_path):
    a, _ = make_process(0x33, threads=(1,))
    (tmp_path / "a.trace").write_bytes(a)
    (tmp_path / "b.trace").write_bytes(a)
    cap = read_capture(tmp_path)
    assert len(cap.processes) == 1
    assert cap.processes[0].event_count == 500
    assert any("duplicates" in w for w in cap.warnings)


def test_missing_end_marks_process_incomplete(tmp_path):
    a, _ = make_process(0x44, threads=(1,), end=False)
    (tmp_path / "a.trace").write_bytes(a)
    cap = read_capture(tmp_path)
    assert not cap.processes[0].complete
    assert cap.summary()["incomplete_processes"] == [0]
