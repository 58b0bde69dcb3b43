"""Verbs work requests in mlx5 terms: the opcode a verbs work request becomes on the wire, and the groups of
mlx5 send opcodes the correlator reasons about (which move data, which consume a receive, which read).

The map follows rdma-core's mlx5 provider (providers/mlx5/qp.c, ``mlx5_ib_opcode[]``; ref §2.1): index =
``enum ibv_wr_opcode``, value = the WQE ctrl segment's opcode.  Codes not in it are 0xFF (UNKNOWN).
"""
from __future__ import annotations

from .layouts import OPCODE_NAMES as _NAMES
from .layouts import Opcode

# enum ibv_wr_opcode -> mlx5 send opcode
IBV_WR_TO_MLX5 = {0: Opcode.RDMA_WRITE, 1: Opcode.RDMA_WRITE_IMM, 2: Opcode.SEND, 3: Opcode.SEND_IMM,
                  4: Opcode.RDMA_READ, 5: Opcode.ATOMIC_CS, 6: Opcode.ATOMIC_FA, 7: Opcode.LOCAL_INVAL,
                  8: Opcode.BIND_MW, 9: Opcode.SEND_INVAL, 10: Opcode.TSO}
IBV_WR_TO_MLX5 = {k: int(v) for k, v in IBV_WR_TO_MLX5.items()}
UNKNOWN = 0xFF

# enum ibv_wc_opcode: receive completions are >= IBV_WC_RECV
IBV_WC_RECV = 128
IBV_WC_RECV_RDMA_WITH_IMM = 129
IBV_SEND_SIGNALED = 2          # enum ibv_send_flags
IBV_QPS_RTR = 2                # enum ibv_qp_state

WRITE_OPS = (int(Opcode.RDMA_WRITE), int(Opcode.RDMA_WRITE_IMM))
READ_OPS = (int(Opcode.RDMA_READ),)
SEND_OPS = (int(Opcode.SEND), int(Opcode.SEND_IMM), int(Opcode.SEND_INVAL))
# operations that consume a receive WQE on the target (sends, and RDMA write with immediate)
CONSUMES_RECV = SEND_OPS + (int(Opcode.RDMA_WRITE_IMM),)
ATOMIC_OPS = (int(Opcode.ATOMIC_CS), int(Opcode.ATOMIC_FA), int(Opcode.ATOMIC_MASKED_CS),
              int(Opcode.ATOMIC_MASKED_FA))
DATA_OPS = WRITE_OPS + READ_OPS + SEND_OPS + ATOMIC_OPS

OPCODE_NAMES = dict(_NAMES)
OPCODE_NAMES.setdefault(UNKNOWN, "UNKNOWN")
# name of every 8-bit code (a column of codes -> labels in one take)
OPCODE_VOCAB = [OPCODE_NAMES.get(i, f"OP_{i:#x}") for i in range(256)]
