"""Summary of one probe step (native/tests/nvshmem/probe.sh): the trace's doorbells and operations per
process and opcode beside the emulated NIC's own count of the WQEs it executed (SIGMATRACE_EMU_STATS).
  python3 native/tests/nvshmem/summarize.py STEP_DIR
"""
import json
import sys
from collections import Counter
from pathlib import Path

from sigmatrace.correlate import correlate
from sigmatrace.mlx5.verbs import DATA_OPS

d = Path(sys.argv[1])
nic = {}
for f in (d / "stats").glob("emu-stats.*.json"):
    s = json.loads(f.read_text())
    nic[int(s["pid"])] = s
corr = correlate(d / "trace", workers=2)
db, ops, P = corr.tables["doorbells"], corr.tables["ops"], corr.tables["processes"]
out = {"doorbells": int(len(db["doorbell_id"])), "complete": int(db["complete"].sum()) if len(db["doorbell_id"]) else 0,
       "stats": {k: v for k, v in corr.stats.items() if isinstance(v, (int, float, str, dict))}, "processes": []}
for i, pid in enumerate(P["pid"]):
    mine = ops["process"] == i
    got = Counter(int(c) for c in ops["opcode"][mine])
    truth = nic.get(int(pid), {}).get("wqes_by_opcode", {})
    want = {int(k, 16): v for k, v in truth.items() if int(k, 16) in DATA_OPS}
    out["processes"].append({"pid": int(pid), "trace": dict(got), "nic": want, "nic_all": truth,
                             "equal": dict(got) == want})
print(json.dumps(out, indent=1, default=str))
