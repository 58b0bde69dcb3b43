"""Persistent-kernel BFS on a Graph500 Kronecker graph (paper §VI-D, Figs. 8-9).

Graph: Kronecker generator (A, B, C) = (0.57, 0.19, 0.19), 2^scale vertices,
edgefactor * 2^scale edges, drawn with numpy from the seed; self loops dropped,
made undirected, deduplicated, CSR.  Vertex labels are *not* permuted (option
`permute`), so, as with the paper's soc-LiveJournal1 ordering, the low vertex ids
are the hubs and 1D block partitioning gives them to GPU 0.

Kernel (one persistent kernel per GPU, `blocks` thread blocks): level-synchronous.
For every frontier vertex u and edge (u, v):
  * v local  -> device-side CAS on visited[v] (no RDMA; gpu_work_ns_per_edge)
  * v remote -> ATOMIC_CS on visited[v] at its owner (compare 0, swap level+1),
                batched `batch` WQEs per doorbell;
then, for every remote CAS this GPU won (old value 0, read back from the model's
responder memory), an ATOMIC_FA on the owner's queue tail and an 8-byte inline
RDMA_WRITE of v into that queue (the frontier enqueue).  Then a global barrier:
each GPU posts an ATOMIC_FA (+1) to the barrier counter of every other GPU
(tag BARRIER, phase = level) and spins until its own counter reaches
(P-1)*(level+1).  Barrier arrival of a GPU = the doorbell of its first barrier
atomic; the model records true arrivals in truth["barriers"].

Tags in the WQE truth: 1 visit CAS, 2 enqueue FA, 3 enqueue write, 4 barrier.
"""
import numpy as np

from ..cluster import Cluster
from .common import tracer_from, timing_from

TAG_VISIT, TAG_ENQ_FA, TAG_ENQ_PUT, TAG_BARRIER = 1, 2, 3, 4
VISITED_OFF = 0x0100_0000     # u64 visited[] (level+1) per owned vertex
QUEUE_OFF = 0x0200_0000       # u64 queue of vertices enqueued by peers
TAIL_OFF = 0x0000_1000        # queue tail counter
BARRIER_OFF = 0x0000_2000     # barrier counter

PARAMS = {
    "scale": (int, 9, "log2 of the number of vertices"),
    "edgefactor": (int, 8, "edges per vertex"),
    "gpus": (int, 4, "GPUs (1D partitions)"),
    "blocks": (int, 4, "thread blocks per GPU"),
    "batch": (int, 8, "WQEs per doorbell for the visit CASes"),
}


def kronecker(scale, edgefactor, rng, a=0.57, b=0.19, c=0.19, permute=False):
    n = 1 << scale
    m = edgefactor * n
    src = np.zeros(m, np.int64)
    dst = np.zeros(m, np.int64)
    ab, c_norm, a_norm = a + b, c / (1 - (a + b)), a / (a + b)
    for bit in range(scale):
        ii = rng.random(m) > ab
        jj = rng.random(m) > np.where(ii, c_norm, a_norm)
        src |= ii.astype(np.int64) << bit
        dst |= jj.astype(np.int64) << bit
    if permute:
        perm = rng.permutation(n)
        src, dst = perm[src], perm[dst]
    keep = src != dst
    src, dst = src[keep], dst[keep]
    u = np.concatenate([src, dst])
    v = np.concatenate([dst, src])
    key = np.unique(u * n + v)
    u, v = key // n, key % n
    indptr = np.zeros(n + 1, np.int64)
    np.add.at(indptr, u + 1, 1)
    return np.cumsum(indptr), v


def bfs_levels(indptr, adj, root):
    n = len(indptr) - 1
    dist = np.full(n, -1, np.int64)
    dist[root] = 0
    frontier = np.array([root])
    lvl = 0
    while len(frontier):
        nb = np.concatenate([adj[indptr[u]:indptr[u + 1]] for u in frontier]) if len(frontier) else np.zeros(0, np.int64)
        nb = np.unique(nb)
        nb = nb[dist[nb] < 0]
        dist[nb] = lvl + 1
        frontier = nb
        lvl += 1
    return dist


def run(output, scale=9, edgefactor=8, gpus=4, nodes=1, nics_per_node=1, blocks=4, batch=8, seed=3,
        mode="simple", hijack="recovery", batch_threshold=128, poller_wakeup_ns=None, qp_depth=1024,
        permute=False, timing=None, root=None, **_):
    rng = np.random.default_rng(seed)
    indptr, adj = kronecker(scale, edgefactor, rng, permute=permute)
    n = len(indptr) - 1
    deg = np.diff(indptr)
    if root is None:
        cands = np.flatnonzero(deg > 0)
        root = int(cands[rng.integers(len(cands))])
    dist = bfs_levels(indptr, adj, root)
    n_levels = int(dist.max()) + 1
    P = gpus
    gpn = max(1, P // nodes)
    per = -(-n // P)
    owner = np.arange(n) // per

    c = Cluster("bfs", nodes=nodes, gpus_per_node=gpn, nics_per_node=nics_per_node, qp_depth=qp_depth, seed=seed,
                timing=timing_from(timing), tracer=tracer_from(mode, hijack, batch_threshold, poller_wakeup_ns))
    c.params = dict(scale=scale, edgefactor=edgefactor, gpus=P, blocks=blocks, batch=batch, root=root,
                    vertices=n, edges=int(len(adj) // 2), levels=n_levels, permute=permute)
    c.setup()
    env = c.env
    t = c.timing
    pes = c.pes
    frontier = {g: [] for g in range(P)}
    if True:
        frontier[int(owner[root])] = [root]
        pes[int(owner[root])].mem.apply("set", pes[int(owner[root])].base + VISITED_OFF + 8 * root, 1, 0)
    level_frontier_sizes = []
    remote_ops = np.zeros((n_levels, P), np.int64)

    c.expect(int(np.count_nonzero(dist >= 0)), "vertex")   # each reached vertex is expanded once

    def expand(pe, verts, level, won, local_next):
        """One thread block: local edges on the GPU, remote visits as batched ATOMIC_CS."""
        g = pe.rank
        by_owner = {}
        local_edges = 0
        for u in verts:
            for v in adj[indptr[u]:indptr[u + 1]]:
                h = int(owner[v])
                if h == g:
                    local_edges += 1
                    if pe.mem.apply("cas", pe.base + VISITED_OFF + 8 * int(v), level + 2, 0) == 0:
                        local_next.append(int(v))
                else:
                    by_owner.setdefault(h, []).append(int(v))
        c.advance(len(verts))
        if local_edges:
            yield env.timeout(local_edges * t.gpu_work_ns_per_edge)
        pending = []
        for h in sorted(by_owner):
            vs = by_owner[h]
            for k in range(0, len(vs), batch):
                chunk = vs[k:k + batch]
                ops = [pe.cas(h, VISITED_OFF + 8 * v, level + 2, 0, tag=TAG_VISIT) for v in chunk]
                base = yield from pe.post(h, ops)
                pending.append((h, base, chunk))
                remote_ops[level, g] += len(ops)
        yield from pe.quiet()
        for h, base, chunk in pending:
            qp = pe.qps[h]
            for k, v in enumerate(chunk):
                if qp.results.pop(base + k, None) == 0:
                    won.append((h, v))

    def kernel(pe):
        g = pe.rank
        for level in range(n_levels):
            pe.phase = level
            verts = frontier[g]
            won, local_next = [], []
            parts = [verts[b::blocks] for b in range(blocks)]
            yield env.all_of([env.process(expand(pe, part, level, won, local_next)) for part in parts if part]
                             or [env.timeout(0)])
            # enqueue won vertices at their owners: fetch-add on the tail, then write the vertex id
            by_h = {}
            for h, v in won:
                by_h.setdefault(h, []).append(v)
            for h in sorted(by_h):
                for v in by_h[h]:
                    base = yield from pe.post(h, [pe.fetch_add(h, TAIL_OFF, 1, tag=TAG_ENQ_FA)])
                    yield from pe.quiet([h])
                    slot = pe.qps[h].results.pop(base)
                    remote_ops[level, g] += 2
                    yield from pe.post(h, [pe.flag(h, QUEUE_OFF + 8 * slot, v + 1, tag=TAG_ENQ_PUT)])
            yield from pe.quiet()
            # global barrier by atomics
            t_arrive = env.now
            for h in range(P):
                if h != g:
                    yield from pe.post(h, [pe.fetch_add(h, BARRIER_OFF, 1, tag=TAG_BARRIER)])
            yield from pe.wait_until(pe.base + BARRIER_OFF, (P - 1) * (level + 1))
            c.truth.barrier(g, level, t_arrive, env.now)
            yield from pe.quiet()
            # next frontier: my local wins + what peers wrote into my queue since the last level
            tail = pe.mem.get(pe.base + TAIL_OFF)
            start = pe.__dict__.get("_qhead", 0)
            queued = [pe.mem.get(pe.base + QUEUE_OFF + 8 * s) - 1 for s in range(start, tail)]
            pe._qhead = tail
            frontier[g] = sorted(set(local_next) | set(queued))
            if g == 0:
                level_frontier_sizes.append(sum(len(frontier[h]) for h in range(P)))

    procs = [c.launch(kernel, pe) for pe in pes]
    t_end = c.run(procs)
    # the model's BFS must agree with the reference levels
    visited = np.zeros(n, np.int64)
    for pe in pes:
        for v in range(pe.rank * per, min(n, (pe.rank + 1) * per)):
            visited[v] = pe.mem.get(pe.base + VISITED_OFF + 8 * v)
    ok = bool(np.array_equal(visited - 1, dist))
    bar = c.truth.barriers
    spreads = []
    for level in range(n_levels):
        arr = [b[2] for b in bar if b[1] == level]
        last = max((b for b in bar if b[1] == level), key=lambda b: b[2])[0]
        spreads.append({"level": level, "spread_ns": max(arr) - min(arr), "last_rank": int(last),
                        "remote_ops": remote_ops[level].tolist()})
    hub_owner = int(owner[np.argmax(deg)])
    return c.finish(output, t_end, {"bfs": {"levels_match_reference": ok, "levels": n_levels, "root": root,
                                            "hub_owner": hub_owner, "per_level": spreads,
                                            "vertices_per_level": np.bincount(dist[dist >= 0]).tolist()}})
