"""Workloads (F13).  Each module exposes `run(output, **params) -> SimResult` and
`PARAMS` (name -> (type, default, help)) used by `sigmatrace sim`."""
import gc
import importlib

WORKLOADS = {
    "put": ("micro", {"op": "put"}),
    "get": ("micro", {"op": "get"}),
    "atomic": ("micro", {"op": "atomic"}),
    "pingpong": ("micro", {"op": "pingpong"}),
    "micro": ("micro", {}),
    "bfs": ("bfs", {}),
    "moe": ("moe", {}),
    "allreduce": ("allreduce", {}),
    "stress": ("stress", {}),
}


def module(name):
    mod, _ = WORKLOADS[name]
    return importlib.import_module(f".{mod}", __name__)


def run(name, output, **params):
    if name not in WORKLOADS:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(sorted(WORKLOADS))}")
    mod, fixed = WORKLOADS[name]
    merged = dict(fixed)
    merged.update({k: v for k, v in params.items() if v is not None})
    # The hot path allocates millions of short-lived tuples and no reference cycles
    # that matter during a run; the cyclic GC would rescan the growing ground-truth
    # lists again and again (~15 % of the run time).  At the end the youngest
    # generation (everything the run allocated) is collected once: a cost that scales
    # with the run, not with the whole interpreter's heap as a full collection would.
    was = gc.isenabled()
    gc.disable()
    try:
        return module(name).run(output, **merged)
    finally:
        if was:
            gc.enable()
            gc.collect(0)
