"""NVSHMEM microbenchmarks (paper §VI-B, Fig. 4): a persistent single-thread kernel
on PE 0 issues one operation per iteration to PE 1 and measures its latency.

  put       nvshmem_int_p + nvshmem_quiet: 4-byte RDMA_WRITE, wait for its CQE
  get       nvshmem_int_g: 4-byte RDMA_READ, wait for the data (CQE)
  atomic    nvshmem_int_atomic_fetch_add: ATOMIC_FA, wait for the fetched value
  pingpong  PE0 writes a flag (inline write) to PE1, PE1 spins on it and writes
            back; latency = round trip

Modes: hijack = baseline | forward | recovery | nonblocking (tracer settings).
"""
import numpy as np

from ..cluster import Cluster
from .. import wqe as W
from ..closed_form import post_quiet_run
from .common import tracer_from, timing_from

PARAMS = {
    "op": (str, "put", "put | get | atomic | pingpong"),
    "iters": (int, 200, "measured iterations"),
    "warmup": (int, 20, "warm-up iterations (not measured)"),
    "nodes": (int, 2, "nodes (one PE per node)"),
}
FLAG_OFF = 0x1000


def run(output, op="put", iters=200, warmup=20, nodes=2, gpus_per_node=1, nics_per_node=1, seed=1,
        mode="simple", hijack="recovery", batch_threshold=128, poller_wakeup_ns=None, qp_depth=1024,
        timing=None, **_):
    c = Cluster(f"micro-{op}", nodes=nodes, gpus_per_node=gpus_per_node, nics_per_node=nics_per_node,
                qp_depth=qp_depth, seed=seed, timing=timing_from(timing),
                tracer=tracer_from(mode, hijack, batch_threshold, poller_wakeup_ns))
    c.params = dict(op=op, iters=iters, warmup=warmup)
    c.setup(pairs=[(0, 1)])
    env = c.env
    pe0, pe1 = c.pes[0], c.pes[1]
    lat = []

    c.expect(warmup + iters, "iteration")

    def initiator():
        if op in ("put", "get", "atomic"):
            # post + quiet chain: one SimPy step when nothing can interleave (closed_form.py),
            # otherwise the per-event loop below
            one = {"put": lambda: pe0.put(1, 0x100, 4), "get": lambda: pe0.get(1, 0x100, 4),
                   "atomic": lambda: pe0.fetch_add(1, 0x200, 1)}[op]()
            plan = post_quiet_run(pe0, 1, one, warmup + iters, 0)
            if plan is not None:
                t_end, latency, commit = plan
                commit()
                c.advance(warmup + iters)
                lat.extend(latency[warmup:].tolist())
                yield env.timeout(t_end - env.now)
                return
        for it in range(warmup + iters):
            pe0.phase = it
            t0 = env.now
            if op == "put":
                yield from pe0.post(1, [pe0.put(1, 0x100, 4)])
                yield from pe0.quiet()
            elif op == "get":
                yield from pe0.post(1, [pe0.get(1, 0x100, 4)])
                yield from pe0.quiet()
            elif op == "atomic":
                yield from pe0.post(1, [pe0.fetch_add(1, 0x200, 1)])
                yield from pe0.quiet()
            elif op == "pingpong":
                yield from pe0.post(1, [pe0.flag(1, FLAG_OFF, it + 1)])
                yield from pe0.wait_until(pe0.base + FLAG_OFF, it + 1)
            else:
                raise ValueError(f"unknown op {op}")
            if it >= warmup:
                lat.append(env.now - t0)
            c.advance()
        if op == "pingpong":
            yield from pe0.quiet()

    def responder():
        for it in range(warmup + iters):
            pe1.phase = it
            yield from pe1.wait_until(pe1.base + FLAG_OFF, it + 1)
            yield from pe1.post(0, [pe1.flag(0, FLAG_OFF, it + 1)])
        yield from pe1.quiet()

    procs = [c.launch(initiator)]
    if op == "pingpong":
        procs.append(c.launch(responder))
    t_end = c.run(procs)
    a = np.array(lat)
    c.truth_arrays["latency_ns"] = a      # every measured sample, in the .truth.npz
    return c.finish(output, t_end, {"latency_ns": {"median": float(np.median(a)), "mean": float(a.mean()),
                                                   "p99": float(np.percentile(a, 99)), "count": int(len(a)),
                                                   "samples": "npz:latency_ns"}})
