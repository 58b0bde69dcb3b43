"""mlx5 WQE decode throughput: vectorised ``decode_wqebbs`` vs scalar ``parse_wqe``.

Both decode the same 100k WQEBBs in one run (RDMA writes with 1-2 SGEs, 4-byte
inline writes, sends, FA atomics, and 2-WQEBB masked CS atomics, so the
multi-WQEBB head chaining is exercised).  The ratio is vectorised WQEBBs/s over
scalar WQEBBs/s; it is printed and stored in ``benchmark.extra_info``.
"""
from __future__ import annotations

import random
import time

import numpy as np
import pytest

from sigmatrace import mlx5
from sigmatrace.mlx5 import Opcode

pytestmark = pytest.mark.sim

N_WQEBBS = 100_000


def _ring_of_wqes(n_wqebbs: int) -> bytes:
    rng = random.Random(7)
    chunks, idx, used = [], 0, 0
    remote = dict(raddr=0x7F0012345678, rkey=0xABCDEF)
    while used < n_wqebbs:
        r = rng.random()
        if r < 0.08 and n_wqebbs - used >= 2:
            wqe = mlx5.build_wqe(Opcode.ATOMIC_MASKED_CS, idx, 0x123, atomic_size=8, swap_add=1, compare=2,
                                 swap_add_mask=~0 & (2**64 - 1), compare_mask=0, sgl=[(8, 1, 0x1000)], **remote)
        elif r < 0.5:
            wqe = mlx5.build_wqe(Opcode.RDMA_WRITE, idx, 0x123, sgl=[(rng.randrange(1, 1 << 20), 1, 0x2000)]
                                 * rng.randint(1, 2), fm_ce_se=0x08, **remote)
        elif r < 0.7:
            wqe = mlx5.build_wqe(Opcode.RDMA_WRITE, idx, 0x123, inline=b"\x01\x00\x00\x00", **remote)
        elif r < 0.9:
            wqe = mlx5.build_wqe(Opcode.SEND, idx, 0x123, sgl=[(rng.randrange(1, 4096), 1, 0x3000)])
        else:
            wqe = mlx5.build_wqe(Opcode.ATOMIC_FA, idx, 0x123, swap_add=1, sgl=[(8, 1, 0x4000)], **remote)
        chunks.append(wqe)
        idx = (idx + len(wqe) // 64) & 0xFFFF
        used += len(wqe) // 64
    return b"".join(chunks)


@pytest.fixture(scope="module")
def wqebbs():
    return np.frombuffer(_ring_of_wqes(N_WQEBBS), np.uint8).reshape(-1, 64)


def _scalar_decode(buf: bytes, table_heads) -> int:
    total = 0
    for row in table_heads:
        total += mlx5.parse_wqe(buf, int(row) * 64).total_bytes
    return total


def test_vectorised_vs_scalar_decode(benchmark, wqebbs):
    n = wqebbs.shape[0]
    table = benchmark.pedantic(mlx5.decode_wqebbs, args=(wqebbs,), kwargs={"first_index": 0},
                               rounds=10, iterations=1, warmup_rounds=1)
    assert table["valid"][table["is_head"]].all()
    heads = np.nonzero(table["is_head"])[0]
    vector_s = benchmark.stats.stats.min

    buf = wqebbs.tobytes()
    scalar_s = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        scalar_total = _scalar_decode(buf, heads)
        scalar_s = min(scalar_s, time.perf_counter() - t0)
    assert scalar_total == int(table["total_bytes"].sum())

    vector_rate, scalar_rate = n / vector_s, n / scalar_s
    ratio = vector_rate / scalar_rate
    benchmark.extra_info.update({
        "wqebbs": n, "wqes": int(heads.size),
        "vectorised_wqebbs_per_s": round(vector_rate), "scalar_wqebbs_per_s": round(scalar_rate),
        "vectorised_over_scalar": round(ratio, 1),
    })
    print(f"\nmlx5 decode of {n} WQEBBs ({heads.size} WQEs): vectorised {vector_rate / 1e6:.1f} M WQEBB/s, "
          f"scalar {scalar_rate / 1e6:.3f} M WQEBB/s, ratio {ratio:.0f}x")
    assert ratio > 1
