"""Bad input in the reader and the decoder: one error type, one rule (issue 12, finding 11)."""
import io
from pathlib import Path

import pytest

from sigmatrace import format as F
from sigmatrace.decode import decode_file, finish_warnings
from sigmatrace.errors import TraceFormatError
from sigmatrace.format import layout as L
from sigmatrace.format import reader
from sigmatrace.format.writer import chunk_bytes

UID = 0x1234


@pytest.mark.parametrize("kind, data, method", [
    (L.SIDE_PRM_COMMAND, b"\x01\x00", "prm"),                          # shorter than its header
    (L.SIDE_PRM_COMMAND, b"\xff\x00\x00\x00\x00\x00\x00\x00", "prm"),  # lengths past the data
    (L.SIDE_WQE_BYTES, b"\x00" * 6, "wqe"),                            # shorter than its header
    (L.SIDE_WQE_BYTES, b"\x00" * 4 + b"\x00\x00\x02\x00" + b"\x00" * 8 + b"\x00" * 64, "wqe"),  # 2 WQEBBs, 1 there
    (L.SIDE_JSON, b"{not json", "json"),
    (L.SIDE_JSON, b"\xff\xfe", "json"),
])
def test_side_records_raise_trace_format_error(kind, data, method):
    rec = F.SideRecord(7, kind, 0, data)
    with pytest.raises(TraceFormatError, match="side record 7"):
        getattr(rec, method)()


def _capture(tmp_path, header_payload):
    buf = io.BytesIO()
    with F.TraceWriter(buf, UID) as w:
        w.thread(0, name="main")
        w.end({"dropped_events": 0})
    good = buf.getvalue()
    bad = chunk_bytes(L.CHUNK_PROCESS, UID, 0, 0, header_payload)
    p = tmp_path / "bad_header.bin"
    p.write_bytes(bad + good)
    return p


def test_bad_json_header_one_rule_in_reader_and_decoder(tmp_path):
    p = _capture(tmp_path, b'{"host": "a", ' + b" " * 10)     # cut JSON
    with pytest.raises(TraceFormatError, match="bad JSON in PROCESS chunk"):
        F.read_capture(p)                                         # raise mode: the documented error
    cap = F.read_capture(p, errors="recover")                    # recover mode: a warning, the rest read
    assert len(cap.processes) == 1 and cap.processes[0].header is None and cap.processes[0].complete
    fd = finish_warnings(decode_file(p))
    assert fd.processes[0].header is None and fd.processes[0].end is not None
    bad = [w for w in cap.warnings if "bad JSON" in w]
    assert bad and bad == [w for w in fd.warnings if "bad JSON" in w]   # the same message, file and offset


def test_header_that_is_not_an_object(tmp_path):
    p = _capture(tmp_path, b"[1, 2, 3]\0\0\0\0\0\0\0")
    cap = F.read_capture(p, errors="recover")
    fd = finish_warnings(decode_file(p))
    assert [w for w in cap.warnings if "not an object" in w] == [w for w in fd.warnings if "not an object" in w] != []


def test_resynchronisation_copies_the_buffer_once(monkeypatch):
    """Skipping many corrupt chunks of a buffer without ``find`` (a memoryview) made one full copy per
    corrupt chunk (quadratic); now one per file."""
    chunk = chunk_bytes(L.CHUNK_THREAD, UID, 0, 0, F.writer.json_payload({"name": "t"}))
    broken = bytearray(chunk)
    broken[40] ^= 0xFF                                            # CRC mismatch
    data = memoryview((bytes(broken) + chunk) * 300)          # a corrupt chunk before every good one
    copies = []

    class CountingBytes(bytes):      # the reader's `bytes`, counting whole-buffer copies
        def __new__(cls, *a):
            if a and isinstance(a[0], memoryview) and len(a[0]) == len(data):
                copies.append(1)
            return bytes.__new__(cls, *a)

    monkeypatch.setattr(reader, "bytes", CountingBytes, raising=False)
    losses = []
    got = list(reader.iter_chunks("mem", errors="recover", losses=losses, data=data))
    assert len(got) == 300 and len(losses) == 300
    assert len(copies) == 1


def test_capture_concatenated_with_itself_is_read_once_with_a_warning(tmp_path):
    from sigmatrace.correlate import correlate
    src = (Path(__file__).resolve().parent.parent / "fixtures" / "put.bin").read_bytes()
    twice = tmp_path / "twice.bin"
    twice.write_bytes(src + src)
    once = correlate(Path(__file__).resolve().parent.parent / "fixtures" / "put.bin", workers=1)
    got = correlate(twice, workers=1)
    assert [w for w in got.warnings if "after their END chunk" in w and "ignored" in w]
    assert got.stats["events"] == once.stats["events"]
    assert len(got.tables["ops"]["op_id"]) == len(once.tables["ops"]["op_id"])
    cap = F.read_capture(twice)
    assert [w for w in cap.warnings if "after their END chunk" in w]
    assert len(cap.events) == len(F.read_capture(Path(__file__).resolve().parent.parent / "fixtures" / "put.bin").events)
