"""MoE inference dispatch/combine (paper §VI-E, Fig. 10), DeepEP-style over IBGDA.

nodes x gpus_per_node ranks (data-parallel attention, expert-parallel MoE),
`experts` routed experts spread evenly over the ranks, top-k routing.  Routing
skew is one parameter `skew` (0 = uniform): the token load of the DP ranks and
the popularity of the experts both follow Zipf(skew) over a random order drawn
from the seed, so `skew=0` gives balanced traffic and `skew>=1` concentrates
tokens on a few ranks and hot experts on a few GPUs.

Per layer:
  notify    every rank writes the number of tokens it will send to every other
            rank (4-byte inline RDMA_WRITE, tag 1)
  dispatch  every token goes once to every rank hosting one of its top-k experts:
            RDMA_WRITE of tokens_per_wqe tokens x hidden_bytes each (tag 2), then an
            ATOMIC_FA (+tokens) on the receiver's dispatch counter (tag 3); the
            receiver spins until all announced tokens arrived
  experts   compute time expert_ns_per_token per (token, local expert)
  combine   every receiver writes one combined hidden vector per token back to its
            origin (tag 4) + ATOMIC_FA on the origin's combine counter (tag 5)
All traffic goes over RDMA (peer memory disabled, as in the paper's setup).
"""
import numpy as np

from ..cluster import Cluster
from .common import tracer_from, timing_from

TAG_NOTIFY, TAG_DISPATCH, TAG_DISPATCH_SIG, TAG_COMBINE, TAG_COMBINE_SIG = 1, 2, 3, 4, 5
COUNT_OFF, DISPATCH_CNT, COMBINE_CNT = 0x1000, 0x2000, 0x3000
RECV_BUF, COMBINE_BUF = 0x1000_0000, 0x4000_0000

PARAMS = {
    "skew": (float, 0.0, "Zipf exponent of token load and expert popularity (0 = uniform)"),
    "tokens": (int, 48, "mean tokens per rank per layer"),
    "experts": (int, 256, "routed experts"),
    "topk": (int, 8, "experts per token"),
    "hidden_bytes": (int, 14336, "bytes per token (7168 x bf16)"),
    "layers": (int, 1, "MoE layers"),
    "tokens_per_wqe": (int, 4, "tokens per RDMA_WRITE"),
}


def zipf_weights(n, s, rng):
    w = 1.0 / np.arange(1, n + 1) ** s
    return w[rng.permutation(n)] / w.sum()


def run(output, nodes=4, gpus_per_node=4, nics_per_node=1, skew=0.0, tokens=48, experts=256, topk=8,
        hidden_bytes=14336, layers=1, tokens_per_wqe=4, seed=5, mode="simple", hijack="recovery",
        batch_threshold=128, poller_wakeup_ns=None, qp_depth=1024, timing=None, expert_ns_per_token=400.0, **_):
    rng = np.random.default_rng(seed)
    P = nodes * gpus_per_node
    per_rank = experts // P
    c = Cluster("moe", nodes=nodes, gpus_per_node=gpus_per_node, nics_per_node=nics_per_node, qp_depth=qp_depth,
                seed=seed, timing=timing_from(timing), tracer=tracer_from(mode, hijack, batch_threshold, poller_wakeup_ns))
    c.params = dict(skew=skew, tokens=tokens, experts=experts, topk=topk, hidden_bytes=hidden_bytes, layers=layers,
                    tokens_per_wqe=tokens_per_wqe)
    c.setup()
    env = c.env
    pes = c.pes
    load = zipf_weights(P, skew, rng)
    popularity = zipf_weights(experts, skew, rng)
    # routing per layer: dest[layer][src] -> {dst rank: number of tokens}
    routing = []
    for layer in range(layers):
        n_tok = np.maximum(1, np.round(load * tokens * P)).astype(int)
        per_src = []
        for r in range(P):
            n = int(n_tok[r])
            # top-k experts per token, drawn without replacement with probability ~ popularity
            # (Gumbel top-k: the k largest log p + Gumbel noise are such a draw)
            keys = np.log(popularity)[None, :] - np.log(-np.log(rng.random((n, experts))))
            ex = np.argpartition(-keys, topk - 1, axis=1)[:, :topk]
            hit = np.zeros((n, P), bool)
            hit[np.arange(n)[:, None], ex // per_rank] = True      # each token goes once to each rank
            per_src.append(hit.sum(axis=0))
        routing.append(np.array(per_src))

    def send_tokens(pe, peer, n, buf, tag, counter, tag_signal):
        """n hidden vectors to peer's buf (tokens_per_wqe per RDMA write), then one
        fetch-add on its counter; posted 16 WQEs per doorbell (dispatch and combine)."""
        if n == 0:
            return
        ops = []
        for t0 in range(0, n, tokens_per_wqe):
            m = min(tokens_per_wqe, n - t0)
            ops.append(pe.put(peer, buf + (pe.rank * 4096 + t0) * hidden_bytes % (1 << 27), m * hidden_bytes, tag=tag))
        ops.append(pe.fetch_add(peer, counter, n, tag=tag_signal))
        for k0 in range(0, len(ops), 16):
            yield from pe.post(peer, ops[k0:k0 + 16])

    c.expect(layers * P * 2 * (P - 1), "transfer")    # per layer, each GPU dispatches to and combines from each peer

    def kernel(pe):
        r = pe.rank
        expect = expect_c = 0          # the counters accumulate over layers
        for layer, R in enumerate(routing):
            pe.phase = layer
            # notify: token counts to every peer
            for d in range(P):
                if d != r:
                    yield from pe.post(d, [pe.flag(d, COUNT_OFF + 8 * r, int(R[r, d]) + 1, tag=TAG_NOTIFY)])
            # dispatch
            for k in range(1, P):
                d = (r + k) % P
                yield from send_tokens(pe, d, int(R[r, d]), RECV_BUF, TAG_DISPATCH, DISPATCH_CNT, TAG_DISPATCH_SIG)
                c.advance()
            # wait for the announced tokens (counts arrive with notify, data with the counter)
            for s in range(P):
                if s != r:
                    yield from pe.wait_until(pe.base + COUNT_OFF + 8 * s, 1)
            expect += int(sum(R[s, r] for s in range(P) if s != r))
            yield from pe.wait_until(pe.base + DISPATCH_CNT, expect)
            # experts compute on every received token (and the rank's own tokens)
            recv = int(R[:, r].sum())
            yield env.timeout(recv * min(topk, per_rank) * expert_ns_per_token / 4)
            yield from pe.quiet()
            # combine: one hidden vector per received token back to its origin
            for k in range(1, P):
                s = (r - k) % P
                yield from send_tokens(pe, s, int(R[s, r]), COMBINE_BUF, TAG_COMBINE, COMBINE_CNT, TAG_COMBINE_SIG)
                c.advance()
            expect_c += int(sum(R[r, d] for d in range(P) if d != r))
            yield from pe.wait_until(pe.base + COMBINE_CNT, expect_c)
            yield from pe.quiet()

    t_end = c.run([c.launch(kernel, pe) for pe in pes])
    res = c.finish(output, t_end)
    mat = np.array(res.meta["bytes"]["node_matrix"], dtype=np.float64)
    inter = mat.copy()
    np.fill_diagonal(inter, 0)
    egress = inter.sum(axis=1)
    off = inter[~np.eye(nodes, dtype=bool)]
    moe = {"node_egress_inter": egress.tolist(),
           "egress_imbalance": float(egress.max() / max(egress.min(), 1.0)),
           "heaviest_pair_over_mean": float(off.max() / max(off.mean(), 1.0)),
           "tokens_per_rank": [int(x) for x in np.maximum(1, np.round(load * tokens * P))]}
    res.meta["moe"] = moe
    import json
    with open(res.truth_json, "w") as f:
        json.dump(res.meta, f, indent=1, sort_keys=True)
    return res
