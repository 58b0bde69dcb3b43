"""Long stages of `report`, `sim` and `replay` show progress with their totals on a terminal, and nothing
otherwise (issue 17): each command runs under a pseudo-terminal (Python's pty module), where every stage's bar
must show its total, then with stderr a pipe and with -q, where no bar may appear."""
import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.sim

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "sim")]))
ENV.pop("COLUMNS", None)
BAR = re.compile(r"(\w+):\s+\d+%\|[^|\r\n]*\|\s*\d+/(\d+) ")


def _on_tty(argv, timeout=300):
    """(exit status, everything written to the terminal) of argv with stdin, stdout and stderr a pty."""
    master, slave = pty.openpty()
    p = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, close_fds=True, cwd=ROOT, env=ENV)
    os.close(slave)
    out = b""
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:        # EIO: the other side closed
            break
        if not data:
            break
        out += data
    os.close(master)
    return p.wait(timeout=timeout), out.decode(errors="replace")


def _totals(text):
    """{stage: total} of every progress bar drawn."""
    out = {}
    for stage, total in BAR.findall(text):
        out.setdefault(stage, set()).add(int(total))
    return {k: v.pop() if len(v) == 1 else v for k, v in out.items()}


def _cmd(*args):
    return [sys.executable, "-m", "sigmatrace", *map(str, args)]


def _no_bar(r):
    assert r.returncode == 0, r.stderr
    assert not BAR.search(r.stderr + r.stdout) and "\r" not in r.stderr, r.stderr[-2000:]


def test_report_stages_show_their_totals_on_a_terminal(tmp_path):
    rc, text = _on_tty(_cmd("report", ROOT / "fixtures" / "pingpong.bin", "-o", tmp_path / "rep"))
    assert rc == 0, text[-3000:]
    got = _totals(text)
    tables = len(list((tmp_path / "rep" / "tables").iterdir()))
    assert got["decode"] == 1 and got["correlate"] == 4 and got["tables"] == tables and got["figures"] == 7, got
    assert got["perfetto"] > 100, got        # the events drawn
    assert "sigmatrace report" in text       # the summary is still there


def test_report_without_a_terminal_or_with_q_shows_no_progress(tmp_path):
    _no_bar(subprocess.run(_cmd("report", ROOT / "fixtures" / "pingpong.bin", "-o", tmp_path / "a", "--no-figures"),
                           capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=300))
    rc, text = _on_tty(_cmd("report", ROOT / "fixtures" / "pingpong.bin", "-o", tmp_path / "b", "-q", "--no-figures"))
    assert rc == 0 and not BAR.search(text) and text.strip() == "", text[-2000:]


def test_sim_shows_the_workload_total_and_the_files_written(tmp_path):
    out = tmp_path / "bfs.bin"
    rc, text = _on_tty(_cmd("sim", "bfs", "-o", out))
    assert rc == 0, text[-3000:]
    got = _totals(text)
    truth = json.loads(out.with_suffix(".truth.json").read_text())
    # the vertices the model expands: every vertex the reference BFS reaches
    assert got["simulate"] == sum(truth["bfs"]["vertices_per_level"]), got
    assert got["write"] == len(truth["processes"]) + 1, got      # one process file each, then the truth
    rc, text = _on_tty(_cmd("sim", "moe", "-o", tmp_path / "moe.bin"))
    P = 16
    assert rc == 0 and _totals(text)["simulate"] == 2 * P * (P - 1), text[-2000:]   # dispatch + combine per pair
    _no_bar(subprocess.run(_cmd("sim", "bfs", "-o", tmp_path / "b2.bin"), capture_output=True, text=True, env=ENV,
                           cwd=ROOT, timeout=300))
    rc, text = _on_tty(_cmd("sim", "bfs", "-o", tmp_path / "b3.bin", "-q"))
    assert rc == 0 and not BAR.search(text), text[-2000:]


def test_replay_shows_qps_files_and_correlate_steps(tmp_path):
    cap = ROOT / "fixtures" / "moe.bin"
    rc, text = _on_tty(_cmd("replay", cap))
    assert rc == 0, text[-3000:]
    got = _totals(text)
    r = subprocess.run(_cmd("replay", cap, "--json"), capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=300)
    _no_bar(r)
    assert got["replay"] == json.loads(r.stdout)["replay"]["qps"] and got["decode"] == 1 and got["correlate"] == 4, got
