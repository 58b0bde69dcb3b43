"""Bad input on the command line: a one-line error and a non-zero exit, never a traceback (issue 17)."""
import shutil
from pathlib import Path

import pytest

from sigmatrace.cli.main import main

FIX = Path(__file__).resolve().parent.parent / "fixtures"


def cli(argv, capsys):
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(rc, err, *words):
    lines = [l for l in err.splitlines() if l.strip()]
    assert rc == 2, (rc, err)
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert "error:" in lines[0]
    for w in words:
        assert w in lines[0], (w, lines[0])


@pytest.mark.parametrize("argv, words", [
    (["sim", "put", "-o", "/proc/no/x.bin"], ["no such directory"]),
    (["sim", "moe", "-p", "skew=abc", "-o", "{tmp}/a.bin"], ["skew expects a number"]),
    (["sim", "moe", "--nodes", "0", "-o", "{tmp}/a.bin"], ["--nodes", "at least 1"]),
    (["sim", "moe", "--gpus-per-node", "0", "-o", "{tmp}/a.bin"], ["--gpus-per-node"]),
    (["sim", "moe", "--nodes", "-2", "-o", "{tmp}/a.bin"], ["--nodes"]),
    (["sim", "put", "--queue-depth", "0", "-o", "{tmp}/a.bin"], ["power of two"]),
    (["sim", "put", "--queue-depth", "3", "-o", "{tmp}/a.bin"], ["power of two"]),
    (["sim", "bfs", "-p", "scale=0", "-o", "{tmp}/a.bin"], ["scale must be at least 1"]),
    (["sim", "put", "-p", "nosuchparam=3", "-o", "{tmp}/a.bin"], ["unknown parameter 'nosuchparam'"]),
    (["sim", "put", "-p", "iters=2.5", "-o", "{tmp}/a.bin"], ["iters expects an integer"]),
    (["sim", "moe", "-p", "experts=4", "-o", "{tmp}/a.bin"], ["cannot run"]),
    (["sim", "nosuch", "-o", "{tmp}/a.bin"], ["unknown workload"]),
    (["sim", "moe", "-o", "{tmp}"], ["is a directory"]),
    (["query", FIX / "put.bin", "select 1", "--limit", "-1"], ["--limit"]),
    (["replay", FIX / "put.bin", "--queue-depth", "0"], ["power of two"]),
    (["replay", FIX / "put.bin", "--queue-depth", "3"], ["power of two"]),
    (["replay", FIX / "put.bin", "--queue-depth", "-8"], ["power of two"]),
    (["replay", FIX / "put.bin", "--batch-threshold", "0"], ["--batch-threshold"]),
    (["report", FIX / "put.bin", "-j", "0"], ["--workers"]),
    (["report", FIX / "put.bin", "--batch-records", "0"], ["--batch-records"]),
    (["report", FIX / "put.bin", "--max-perfetto-events", "-5"], ["--max-perfetto-events"]),
    (["report", "/dev/null", "-o", "{tmp}/r"], ["not a regular file"]),
    (["report", "{tmp}/missing.bin"], ["no such capture"]),
])
def test_one_line_error(argv, words, tmp_path, capsys):
    argv = [str(a).replace("{tmp}", str(tmp_path)) for a in argv]
    rc, _, err = cli(argv, capsys)
    one_line_error(rc, err, *words)
    assert not (tmp_path / "a.bin").exists() and not (tmp_path / "r").exists()


def test_query_options_between_source_and_sql(capsys):
    rc, out, err = cli(["query", FIX / "put.bin", "--format", "csv", "select 42 as x"], capsys)
    assert rc == 0, err
    assert out.splitlines() == ["x", "42"]


def test_replay_empty_capture_fails_like_report(tmp_path, capsys):
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    rc_r, _, err_r = cli(["report", empty, "-o", tmp_path / "r"], capsys)
    rc_p, _, err_p = cli(["replay", empty], capsys)
    one_line_error(rc_r, err_r, "no process data")
    one_line_error(rc_p, err_p, "no process data")
    assert not (tmp_path / "r").exists()                          # a failed report leaves no folder


def test_replay_tolerates_a_damaged_file_like_report(tmp_path, capsys):
    d = tmp_path / "cap"
    d.mkdir()
    shutil.copy(FIX / "put.bin", d / "a.bin")
    (d / "b.bin").write_bytes((FIX / "moe.bin").read_bytes()[:3000] + b"garbage")
    rc, out, err = cli(["replay", d], capsys)
    assert rc == 0, err
    assert "warning:" in out and "b.bin" in out and "65 doorbells" in out
    rc, _, err = cli(["report", d, "-o", tmp_path / "r", "-q"], capsys)
    assert rc == 0, err


def test_replay_without_doorbells_checks_nothing(tmp_path, capsys):
    cap = tmp_path / "ar.bin"
    assert cli(["sim", "allreduce", "--mode", "simple", "-p", "iters=1", "-o", cap], capsys)[0] == 0
    rc, out, _ = cli(["replay", cap], capsys)
    assert rc == 0 and "not checked" in out and "all WQEBBs accounted for" not in out
    assert cli(["replay", cap, "--strict"], capsys)[0] == 1       # nothing checked is not a clean bill


def test_report_directory_holds_one_report(tmp_path, capsys):
    out = tmp_path / "r"
    assert cli(["report", FIX / "put.bin", "-o", out, "-q"], capsys)[0] == 0
    assert (out / "trace.pftrace").exists()
    assert cli(["report", FIX / "moe.bin", "-o", out, "-q", "--no-perfetto"], capsys)[0] == 0
    assert not (out / "trace.pftrace").exists()                 # not A's trace beside B's summary
    assert "moe.bin" in (out / "summary.json").read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]    # nothing left aside
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    rc, _, err = cli(["report", FIX / "put.bin", "-o", other], capsys)
    one_line_error(rc, err, "not a sigmatrace report")
    assert (other / "notes.txt").read_text() == "mine"


def test_default_outputs_of_two_captures_of_one_folder_differ(tmp_path, capsys):
    for name in ("put.bin", "get.bin"):
        shutil.copy(FIX / name, tmp_path / name)
        assert cli(["report", tmp_path / name, "-q", "--no-figures"], capsys)[0] == 0
    assert "put.bin" in (tmp_path / "put.report" / "summary.json").read_text()
    assert "get.bin" in (tmp_path / "get.report" / "summary.json").read_text()


def test_every_option_has_help(capsys):
    from sigmatrace.cli.main import build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    missing = [f"{name} {a.option_strings}" for name, p in sub.choices.items() for a in p._actions
               if a.option_strings and not a.help and "-h" not in a.option_strings]
    assert not missing, missing
