"""What the correlator reads of each record type: the event types it joins on and, per type, the narrow
columns it keeps (record fields, EXT slots) with the smallest dtype that holds them.

One definition shared by the numpy decode path (``columns``), the C kernel (``kernel``) and the event store
(``store``).
"""
from __future__ import annotations

import numpy as np

from ..format import events as E

DEFAULT_BATCH_RECORDS = 1 << 18

# event types the correlator reads (its stages: correlate/pipeline.py); everything else only goes to the events table
CORRELATOR_TYPES = ("DROPS", "DB_HIJACK_INSTALL", "IBV_CREATE_QP", "MLX5_DEVX_OBJ_CREATE", "IBV_MODIFY_QP", "IBV_CREATE_AH",
                    "MLX5_DEVX_OBJ_MODIFY", "DB_DOORBELL", "DB_WQE", "DB_WQE_LOST", "IBV_SEND_WR", "IBV_POST_SEND",
                    "IBV_WR_COMPLETE", "IBV_WC",
                    "IBV_POST_RECV",   # which QPs post receives (correlate.collectives.receiving_qps)
                    # UCX / libfabric identities and operations (correlate.hostlib)
                    "UCP_WORKER_CREATE", "UCP_EP_CREATE", "OFI_ENDPOINT", "OFI_AV_INSERT",
                    "UCP_PUT", "UCP_GET", "UCP_ATOMIC", "UCP_TAG_SEND", "UCP_STREAM_SEND", "UCP_AM_SEND",
                    "OFI_SEND", "OFI_TSEND", "OFI_WRITE", "OFI_READ", "OFI_ATOMIC",
                    # NCCL communicators, calls and groups (correlate.collectives)
                    "NCCL_COMM_INIT", "NCCL_COMM_DESTROY", "NCCL_COLL", "NCCL_GROUP_START", "NCCL_GROUP_END")
CORRELATOR_TYPE_LUT = np.zeros(1 << 16, bool)
for _n in CORRELATOR_TYPES:
    CORRELATOR_TYPE_LUT[E.value(_n)] = True

# per correlator type: the named columns the correlator reads (others are only in the events table), with the
# narrowest dtype that holds them.  Workers keep these columns only (``ProcDecode.tables``).
_USED = {"IBV_WC": ("status", "opcode", "qpn", "wr_id", "byte_len"),
         "IBV_SEND_WR": ("opcode", "send_flags", "qpn", "wr_id", "raddr", "rkey", "bytes"),
         "IBV_POST_SEND": ("num_wr", "qpn", "bytes", "wr_id", "opcode"),
         "IBV_WR_COMPLETE": ("num_wr", "qpn", "bytes"),
         "IBV_POST_RECV": ("qpn",),
         **{n: ("op", "ep", "bytes", "raddr") for n in ("UCP_PUT", "UCP_GET", "UCP_ATOMIC", "UCP_TAG_SEND",
                                                       "UCP_STREAM_SEND", "UCP_AM_SEND")},
         **{n: ("op", "ep", "bytes", "dest", "raddr") for n in ("OFI_SEND", "OFI_TSEND", "OFI_WRITE", "OFI_READ",
                                                               "OFI_ATOMIC")},
         "NCCL_COLL": ("kind", "datatype", "comm", "count", "result", "redop", "peer", "duration_ticks")}
_SLOT_DT = dict(aux=np.uint16, obj=np.uint32, arg=np.uint64, x0=np.uint64, x1=np.uint16, x2=np.uint32, x3=np.uint64)
def _type_columns(name):
    """[(column, slot, low bit, width, dtype)] kept for one correlator type."""
    used = _USED.get(name)
    out = []
    for col, sl, lo, width in E.BY_NAME[name].columns():
        if used is not None and col not in used:
            continue
        dt = _SLOT_DT[sl]
        if width is not None and width <= 8:
            dt = np.uint8
        elif width is not None and width <= 16:
            dt = np.uint16 if np.dtype(dt).itemsize >= 2 else dt
        out.append((col, sl, lo, width, dt))
    return out


TYPE_COLUMNS = {E.value(n): (n, _type_columns(n)) for n in CORRELATOR_TYPES}
