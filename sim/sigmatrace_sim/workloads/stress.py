"""Producer-index stress: coalesced doorbells, 16-bit wqe_index wrap, SQ ring wrap,
multi-WQEBB WQEs that straddle the end of the ring.

PE 0 runs `blocks` thread blocks that post, back to back, batches of 1-3 WQEs on one
QP with a small send queue (`qp_depth` WQEBBs): 4-byte RDMA_WRITEs (1 WQEBB),
64-bit masked CS (2 WQEBBs, DS 5) and RDMA_WRITEs with `sges` scatter entries
(DS 2+sges, 2 WQEBBs for 6 SGEs).  The poller is slowed down (`poller_wakeup_ns`)
so that the GPU rings again before the previous value was seen: those doorbells
coalesce.  The run first posts `warmup_wqebb` WQEBBs while the tracer's doorbell
recording is not yet enabled (record_after_ns), so that the 16-bit index wraps
inside the recorded window without recording 65536 WQEBBs.
"""
import numpy as np

from ..cluster import Cluster
from .common import tracer_from, timing_from

PARAMS = {
    "posts": (int, 600, "recorded posts (doorbell stores) after warm-up"),
    "warmup_wqebb": (int, 65536 - 400, "WQEBBs posted before recording starts"),
    "blocks": (int, 2, "posting blocks"),
}


def run(output, posts=600, warmup_wqebb=65536 - 400, blocks=2, qp_depth=128, batch_threshold=32, seed=11,
        mode="full", hijack="nonblocking", poller_wakeup_ns=1000.0, sges=6, timing=None, **_):
    rng = np.random.default_rng(seed)
    tm = timing_from(timing)
    tm.gpu_issue_ns = 2500.0         # tight posting loop, light API overhead
    c = Cluster("stress", nodes=2, gpus_per_node=1, nics_per_node=1, qp_depth=qp_depth, seed=seed, timing=tm,
                tracer=tracer_from(mode, hijack, batch_threshold, poller_wakeup_ns, record_after_ns=float("inf")))
    c.params = dict(posts=posts, warmup_wqebb=warmup_wqebb, blocks=blocks, sges=sges)
    c.setup(pairs=[(0, 1)])
    env = c.env
    pe = c.pes[0]
    qp = pe.qps[1]
    choice = rng.integers(0, 3, size=(200000,))
    nops = rng.integers(1, 4, size=(200000,))
    state = {"k": 0, "recorded_posts": 0}

    def make_ops():
        k = state["k"]
        state["k"] = k + 1
        ops = []
        for j in range(int(nops[k % len(nops)])):
            kind = int(choice[(k * 3 + j) % len(choice)])
            off = 0x10000 + 64 * ((k * 3 + j) % 1024)
            if kind == 0:
                ops.append(pe.put(1, off, 4, tag=1))
            elif kind == 1:
                ops.append(pe.set64(1, off, k + 1, tag=2))
            else:
                ops.append(pe.put(1, off, 4096, tag=3, sges=sges))
        return ops

    c.expect(warmup_wqebb + posts, "post")     # the warm-up fill in WQEBBs, then the recorded posts

    def block(b):
        while qp.sq.resv_head < c.start_index + warmup_wqebb:
            before = qp.sq.resv_head
            yield from pe.post(1, make_ops())
            c.advance(min(qp.sq.resv_head, c.start_index + warmup_wqebb) - before)
        if c.tracer.record_after_ns == float("inf"):
            c.tracer.record_after_ns = env.now + 20000.0   # enable recording (first block to get here)
            yield env.timeout(20000.0)
        while state["recorded_posts"] < posts:
            state["recorded_posts"] += 1
            pe.phase = 1
            yield from pe.post(1, make_ops())
            c.advance()
        yield from pe.quiet()

    t_end = c.run([c.launch(block, b) for b in range(blocks)])
    c.truth_from_ns = c.tracer.record_after_ns - 50000.0   # truth file: the recorded window
    return c.finish(output, t_end)
