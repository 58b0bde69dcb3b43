"""Workloads (F13).  Each module exposes `run(output, **params) -> SimResult` and
`PARAMS` (name -> (type, default, help)) used by `sigmatrace sim`."""
import gc
import importlib
import inspect

from sigmatrace.progress import QUIET

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


class WorkloadError(ValueError):
    """A workload parameter that is unknown, of the wrong type or out of range."""


# parameters every workload may take, and the ranges the model needs
COMMON_TYPES = dict(seed=int, nodes=int, gpus_per_node=int, nics_per_node=int, qp_depth=int, batch_threshold=int,
                    poller_wakeup_ns=float, mode=str, hijack=str, engine=str)
POSITIVE = {"nodes", "gpus_per_node", "nics_per_node", "gpus", "scale", "edgefactor", "iters", "tokens", "experts",
            "topk", "blocks", "batch", "posts", "size", "layers", "tokens_per_wqe", "hidden_bytes",
            "batch_threshold", "slice_bytes", "sges"}
NONNEG = {"warmup", "channels", "skew", "poller_wakeup_ns", "expert_ns_per_token", "poll_interval_ns",
          "warmup_wqebb"}
CHOICES = dict(mode=("aggregate", "simple", "full"), hijack=("baseline", "forward", "recovery", "nonblocking"),
               engine=("auto", "simpy", "vector"), op=("put", "get", "atomic", "pingpong"))


def accepted(name):
    """{parameter: type} that workload ``name`` accepts (its PARAMS, the common ones, its run functions')."""
    mod = module(name)
    types = dict(COMMON_TYPES)
    for fname, fn in inspect.getmembers(mod, inspect.isfunction):
        if not fname.startswith("run") or fn.__module__ != mod.__name__:
            continue
        for p in inspect.signature(fn).parameters.values():
            if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) or p.name in ("output", "timing"):
                continue
            d = p.default
            if p.name not in types and d is not inspect.Parameter.empty and d is not None:
                types[p.name] = type(d)
            types.setdefault(p.name, None)
    for k, v in getattr(mod, "PARAMS", {}).items():
        types[k] = v[0]
    return types


def validate(name, params):
    """``params`` checked and converted for workload ``name``; WorkloadError (one line) otherwise."""
    types = accepted(name)
    out = {}
    for k, v in params.items():
        if v is None:
            continue
        if k not in types:
            raise WorkloadError(f"{name}: unknown parameter {k!r} (known: {', '.join(sorted(types))})")
        t = types[k]
        if t is bool and not isinstance(v, bool):
            raise WorkloadError(f"{name}: {k} expects true or false, got {v!r}")
        if t in (int, float) and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or (t is int and isinstance(v, float) and not v.is_integer())):
            raise WorkloadError(f"{name}: {k} expects {'an integer' if t is int else 'a number'}, got {v!r}")
        if t is int:
            v = int(v)
        elif t is float:
            v = float(v)
        elif t is str:
            v = str(v)
        if k in POSITIVE and v < 1:
            raise WorkloadError(f"{name}: {k} must be at least 1, got {v}")
        if k in NONNEG and v < 0:
            raise WorkloadError(f"{name}: {k} must be 0 or more, got {v}")
        if k in CHOICES and v not in CHOICES[k]:
            raise WorkloadError(f"{name}: {k} must be one of {', '.join(CHOICES[k])}, got {v!r}")
        if k == "qp_depth" and (v < 2 or v > 1 << 15 or v & (v - 1)):
            raise WorkloadError(f"{name}: qp_depth must be a power of two between 2 and 32768, got {v}")
        out[k] = v
    return out


def run(name, output, progress=None, **params):
    """Run workload ``name`` into ``output``.  ``progress``: a sigmatrace.progress.Progress that shows the
    simulate and write stages with their totals (none: nothing shown)."""
    if name not in WORKLOADS:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(sorted(WORKLOADS))}")
    mod, fixed = WORKLOADS[name]
    merged = dict(fixed)
    merged.update(validate(name, params))
    # The hot path allocates millions of short-lived tuples and no reference cycles
    # that matter during a run; the cyclic GC would rescan the growing ground-truth
    # lists again and again (~15 % of the run time).  At the end the youngest
    # generation (everything the run allocated) is collected once: a cost that scales
    # with the run, not with the whole interpreter's heap as a full collection would.
    was = gc.isenabled()
    gc.disable()
    from ..cluster import PROGRESS
    PROGRESS[0] = progress or QUIET
    try:
        return module(name).run(output, **merged)
    finally:
        PROGRESS[0].close()
        PROGRESS[0] = QUIET
        if was:
            gc.enable()
            gc.collect(0)
