"""Trace format v1 — the Python definition of sizes, offsets and constants.

The C definition is native/include/sigmatrace/format.h; docs/format.md is the
normative text.  tests/test_format_conformance.py checks that both agree.
"""
import numpy as np

MAGIC = 0x4B435453  # bytes b"STCK"
VERSION = 1
MAX_PAYLOAD = 16 << 20

# chunk kinds
CHUNK_PROCESS = 1
CHUNK_EVENTS = 2
CHUNK_SIDE = 3
CHUNK_CALIBRATION = 4
CHUNK_THREAD = 5
CHUNK_AGGREGATE = 6
CHUNK_END = 7
CHUNK_KIND_NAMES = {
    CHUNK_PROCESS: "PROCESS",
    CHUNK_EVENTS: "EVENTS",
    CHUNK_SIDE: "SIDE",
    CHUNK_CALIBRATION: "CALIBRATION",
    CHUNK_THREAD: "THREAD",
    CHUNK_AGGREGATE: "AGGREGATE",
    CHUNK_END: "END",
}

# side record kinds
SIDE_STRING = 1
SIDE_JSON = 2
SIDE_PRM_COMMAND = 3
SIDE_WQE_BYTES = 4
SIDE_BLOB = 5
SIDE_KIND_NAMES = {
    SIDE_STRING: "STRING",
    SIDE_JSON: "JSON",
    SIDE_PRM_COMMAND: "PRM_COMMAND",
    SIDE_WQE_BYTES: "WQE_BYTES",
    SIDE_BLOB: "BLOB",
}
WQE_F_VERIFIED = 0x1
WQE_F_OVERWRITTEN = 0x2

# calibration
CALIB_START = 0
CALIB_PERIODIC = 1
CALIB_END = 2
CALIB_F_TAI_VALID = 0x1
CALIB_F_PTP = 0x2
CALIB_F_INVARIANT_TSC = 0x4

CHUNK_HEADER_DTYPE = np.dtype(
    [
        ("magic", "<u4"),
        ("version", "<u2"),
        ("kind", "<u2"),
        ("process_uid", "<u8"),
        ("thread_index", "<u4"),
        ("payload_len", "<u4"),
        ("count", "<u4"),
        ("crc32", "<u4"),
    ]
)
EVENT_DTYPE = np.dtype(
    [("tsc", "<u8"), ("type", "<u2"), ("aux", "<u2"), ("obj", "<u4"), ("arg", "<u8")]
)
SIDE_HEADER_DTYPE = np.dtype(
    [("side_id", "<u8"), ("length", "<u4"), ("kind", "<u2"), ("flags", "<u2")]
)
SIDE_PRM_DTYPE = np.dtype([("in_len", "<u4"), ("out_len", "<u4")])
SIDE_WQE_DTYPE = np.dtype(
    [
        ("qpn", "<u4"),
        ("first_wqe_index", "<u2"),
        ("num_wqebb", "<u2"),
        ("log_sq_size", "<u4"),
        ("flags", "<u4"),
    ]
)
CALIBRATION_DTYPE = np.dtype(
    [
        ("tsc_before", "<u8"),
        ("tsc_after", "<u8"),
        ("monotonic_raw_ns", "<u8"),
        ("realtime_ns", "<u8"),
        ("tai_ns", "<u8"),
        ("point", "<u4"),
        ("flags", "<u4"),
    ]
)
AGGREGATE_DTYPE = np.dtype(
    [
        ("type", "<u2"),
        ("aux", "<u2"),
        ("obj", "<u4"),
        ("peer", "<u8"),
        ("count", "<u8"),
        ("bytes", "<u8"),
    ]
)

CHUNK_HEADER_SIZE = CHUNK_HEADER_DTYPE.itemsize  # 32
EVENT_SIZE = EVENT_DTYPE.itemsize  # 24
SIDE_HEADER_SIZE = SIDE_HEADER_DTYPE.itemsize  # 16

# Offsets and sizes the conformance test compares with offsetof()/sizeof() in C.
C_STRUCTS = {
    "st_chunk_header": CHUNK_HEADER_DTYPE,
    "st_event": EVENT_DTYPE,
    "st_side_header": SIDE_HEADER_DTYPE,
    "st_side_prm": SIDE_PRM_DTYPE,
    "st_side_wqe": SIDE_WQE_DTYPE,
    "st_calibration": CALIBRATION_DTYPE,
    "st_aggregate": AGGREGATE_DTYPE,
}
C_CONSTANTS = {
    "ST_FORMAT_MAGIC": MAGIC,
    "ST_FORMAT_VERSION": VERSION,
    "ST_MAX_PAYLOAD": MAX_PAYLOAD,
    "ST_CHUNK_PROCESS": CHUNK_PROCESS,
    "ST_CHUNK_EVENTS": CHUNK_EVENTS,
    "ST_CHUNK_SIDE": CHUNK_SIDE,
    "ST_CHUNK_CALIBRATION": CHUNK_CALIBRATION,
    "ST_CHUNK_THREAD": CHUNK_THREAD,
    "ST_CHUNK_AGGREGATE": CHUNK_AGGREGATE,
    "ST_CHUNK_END": CHUNK_END,
    "ST_SIDE_STRING": SIDE_STRING,
    "ST_SIDE_JSON": SIDE_JSON,
    "ST_SIDE_PRM_COMMAND": SIDE_PRM_COMMAND,
    "ST_SIDE_WQE_BYTES": SIDE_WQE_BYTES,
    "ST_SIDE_BLOB": SIDE_BLOB,
    "ST_WQE_F_VERIFIED": WQE_F_VERIFIED,
    "ST_WQE_F_OVERWRITTEN": WQE_F_OVERWRITTEN,
    "ST_CALIB_START": CALIB_START,
    "ST_CALIB_PERIODIC": CALIB_PERIODIC,
    "ST_CALIB_END": CALIB_END,
    "ST_CALIB_F_TAI_VALID": CALIB_F_TAI_VALID,
    "ST_CALIB_F_PTP": CALIB_F_PTP,
    "ST_CALIB_F_INVARIANT_TSC": CALIB_F_INVARIANT_TSC,
}

# PROCESS header key: libraries the process loaded whose provider was disabled or not built, a list of
# {"library", "path", "provider", "reason"} (docs/format.md)
HEADER_UNTRACED_LIBRARIES = "untraced_libraries"
UNTRACED_DISABLED = "disabled"
UNTRACED_NOT_BUILT = "not_built"
# the string constants the conformance test compares with the C definition
C_STRINGS = {
    "ST_HEADER_UNTRACED_LIBRARIES": HEADER_UNTRACED_LIBRARIES,
    "ST_UNTRACED_DISABLED": UNTRACED_DISABLED,
    "ST_UNTRACED_NOT_BUILT": UNTRACED_NOT_BUILT,
}


def pad8(n: int) -> int:
    """Bytes needed to round n up to a multiple of 8."""
    return (-n) & 7
