"""`sigmatrace report` / `sigmatrace query` end to end, and malformed inputs (one-line messages, partial results)."""
import json
import re
import shutil
from pathlib import Path

import pytest

from sigmatrace.cli.main import main
from sigmatrace_sim.synthetic import write_synthetic

pytestmark = pytest.mark.sim


@pytest.fixture(scope="module")
def capdir(tmp_path_factory):
    d, truth = write_synthetic(tmp_path_factory.mktemp("cap"), seed=11)
    return Path(d)


def test_report_writes_everything(capdir, tmp_path, capsys):
    out = tmp_path / "rep"
    assert main(["report", str(capdir), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "top talkers" in text and "drops/losses" in text and "skew" in text
    assert (out / "trace.pftrace").stat().st_size > 0
    s = json.loads((out / "summary.json").read_text())
    for k in ("per_qp", "per_gpu", "rank_matrix", "node_matrix", "losses", "clock", "skew", "barriers"):
        assert k in s
    assert s["operations"] == s["operations_matched"] > 0
    assert list((out / "tables" / "ops").glob("part-*.parquet")) and (out / "tables" / "doorbells.parquet").exists()
    assert (out / "figures" / "matrix_node.png").exists() and (out / "figures" / "matrix_node.svg").exists()
    assert (out / "figures" / "barriers.svg").exists()


def test_query_report_and_capture(capdir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "rep"
    assert main(["report", str(capdir), "-o", str(out), "-q", "--no-figures", "--no-perfetto"]) == 0
    capsys.readouterr()
    assert main(["query", str(out), "select count(*) as n from ops where matched", "--format", "json"]) == 0
    n = json.loads(capsys.readouterr().out)[0]["n"]
    assert n > 0
    monkeypatch.setenv("SIGMATRACE_CACHE", str(tmp_path / "cache"))
    assert main(["query", str(capdir), "--named", "barriers", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 4 and all(r["spread_ns"] > 0 for r in rows)
    assert main(["query", "--list"]) == 0
    assert "skew_node" in capsys.readouterr().out
    assert main(["query", str(out), "select * from no_such_table"]) == 2
    assert "SQL" in capsys.readouterr().err


def _one_line_error(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]
    return err[0]


def test_malformed_truncated_file(capdir, tmp_path, capsys):
    d = tmp_path / "cut"
    shutil.copytree(capdir, d)
    f = sorted(d.glob("*.trace"))[1]
    data = f.read_bytes()
    f.write_bytes(data[: len(data) * 2 // 3])
    assert main(["report", str(d), "-o", str(tmp_path / "r"), "--no-figures"]) == 0
    out = capsys.readouterr().out
    assert "lost" in out and "incomplete" in out
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["losses"]["lost_bytes"] > 0 and s["processes"] == 4


def test_malformed_missing_process_file(capdir, tmp_path, capsys):
    d = tmp_path / "missing"
    shutil.copytree(capdir, d)
    sorted(d.glob("*.trace"))[3].unlink()
    assert main(["report", str(d), "-o", str(tmp_path / "r"), "--no-figures", "--no-perfetto"]) == 0
    out = capsys.readouterr().out
    assert "ranks [3] have no process file" in out
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["processes"] == 3 and s["operations"] > 0


def test_malformed_duplicated_rank_and_mixed_version(capdir, tmp_path, capsys):
    from sigmatrace.format import layout as L
    d = tmp_path / "dup"
    shutil.copytree(capdir, d)
    files = sorted(d.glob("*.trace"))
    # a second copy of rank 0 under another uid is a duplicated rank
    data = bytearray(files[0].read_bytes())
    (d / "zz.copy.trace").write_bytes(_reuid(bytes(data), 0xDEAD))
    # a file of another format version
    bad = bytearray(files[1].read_bytes()[:64])
    bad[4:6] = (L.VERSION + 1).to_bytes(2, "little")
    (d / "zz.v2.trace").write_bytes(bytes(bad))
    assert main(["report", str(d), "-o", str(tmp_path / "r"), "--no-figures", "--no-perfetto"]) == 0
    out = capsys.readouterr().out
    assert "rank 0 appears in 2 processes" in out
    assert "unsupported format version" in out


def _reuid(data, uid):
    """Rewrite every chunk's process_uid (and CRC) of one file."""
    import struct
    import zlib
    out = bytearray()
    off = 0
    while off + 32 <= len(data):
        magic, ver, kind, _, th, plen, cnt, _ = struct.unpack_from("<IHHQIIII", data, off)
        payload = data[off + 32: off + 32 + plen]
        head = struct.pack("<IHHQIII", magic, ver, kind, uid, th, plen, cnt)
        crc = zlib.crc32(payload, zlib.crc32(head)) & 0xFFFFFFFF
        out += head + struct.pack("<I", crc) + payload
        off += 32 + plen
    return bytes(out)


def test_unreadable_inputs_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope"), "-o", str(tmp_path / "r")]) == 2
    _one_line_error(capsys)
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not a capture at all" * 10)
    assert main(["report", str(junk), "-o", str(tmp_path / "r2")]) == 2
    assert "no process data" in _one_line_error(capsys)


def test_heatmap_of_many_ranks_stays_readable(tmp_path):
    """A 128x128 rank matrix is drawn as a bounded image (one block per cell, every k-th label), not a
    figure that grows 0.6 inch per rank."""
    import numpy as np
    from PIL import Image
    from sigmatrace import analysis as A
    n = 128
    m = np.zeros((n, n))
    m[np.arange(n), (np.arange(n) + 1) % n] = 1e9
    paths = A.heatmap([f"rank{i}" for i in range(n)], m, str(tmp_path / "matrix_rank"))
    assert sorted(Path(p).suffix for p in paths) == [".png", ".svg"]
    w, h = Image.open(tmp_path / "matrix_rank.png").size
    assert 1000 < w <= 26 * 120 and 1000 < h <= 24 * 120
    svg = (tmp_path / "matrix_rank.svg").read_text()
    shown = {t for t in re.findall(r"<!-- (rank\d+) -->", svg)}
    assert shown == {f"rank{i}" for i in range(0, n, 4)}         # every 4th label of 128 (matplotlib names
    # each drawn text in a comment)


def test_report_names_the_process_that_ended_early(tmp_path, capsys):
    """A process file without its END chunk (a rank killed, or a file cut): the summary and the terminal say
    which process it was and when its last event was recorded; the others stay complete."""
    from sigmatrace.format.layout import CHUNK_END
    from sigmatrace.format.reader import iter_chunks
    cap = tmp_path / "cap"
    write_synthetic(cap, nodes=1, procs_per_node=2, doorbells_per_qp=8, pingpongs=8)
    victim = sorted(cap.glob("*.trace"))[1]
    (end,) = [c for c in iter_chunks(victim) if c.kind == CHUNK_END]
    with open(victim, "r+b") as f:      # the END chunk is the file's last: cut it off as a SIGKILL would
        f.truncate(end.offset)
    assert main(["report", str(cap), "-o", str(tmp_path / "rep"), "--no-figures", "--no-perfetto"]) == 0
    out = capsys.readouterr().out
    s = json.loads((tmp_path / "rep" / "summary.json").read_text())
    (e,) = s["losses"]["ended_early"]
    assert s["losses"]["incomplete_processes"] == [e["process"]]
    assert e["path"] and e["last_event_ns"] is not None and e["last_event_ns"] > 0
    assert re.search(rf"ended early: pid {e['pid']}\b.*no END record.*last event at \+", out), out


def test_summary_json_writer(tmp_path):
    """summary.json: the cleaned values (NaN/inf -> null, numpy -> Python, whole arrays at once) written as
    the standard encoder writes them, the first levels one member per line."""
    import json
    import numpy as np
    from sigmatrace.report.summary import _clean, write_summary
    m = np.arange(12, dtype=float).reshape(3, 4)
    m[1, 2] = np.nan
    m[2, 3] = np.inf
    raw = {"matrix": {"bytes": m, "ops": np.arange(6, dtype=np.int64).reshape(2, 3), "ok": np.array([True, False])},
           "clock": {"node": {"a": np.float64(1.5), "b": [np.int32(3), float("nan")]}}, "empty": {}, "n": np.int64(7),
           1: "key"}
    s = _clean(raw)
    assert s["matrix"]["bytes"][1][2] is None and s["matrix"]["bytes"][2][3] is None
    assert s["matrix"]["bytes"][0] == [0.0, 1.0, 2.0, 3.0] and type(s["matrix"]["ops"][1][2]) is int
    assert s["matrix"]["ok"] == [True, False] and s["clock"]["node"]["b"] == [3, None] and s["n"] == 7
    write_summary(s, tmp_path / "s.json")
    text = (tmp_path / "s.json").read_text()
    assert json.loads(text) == json.loads(json.dumps(s)) == s
    lines = text.splitlines()
    assert lines[0] == "{" and ' "matrix": {' in lines and '  "node": {' in lines and ' "empty": {},' in lines
