"""Trace format v1 (docs/format.md): layout, event table, reader, writer."""
from . import events, layout
from .layout import (
    AGGREGATE_DTYPE,
    CALIBRATION_DTYPE,
    CHUNK_HEADER_DTYPE,
    EVENT_DTYPE,
    SIDE_BLOB,
    SIDE_JSON,
    SIDE_PRM_COMMAND,
    SIDE_STRING,
    SIDE_WQE_BYTES,
    VERSION,
)
from .reader import Capture, Chunk, Loss, ProcessInfo, SideRecord, capture_files, iter_chunks, read_capture
from .writer import TraceWriter, chunk_bytes

__all__ = [
    "events", "layout", "EVENT_DTYPE", "CALIBRATION_DTYPE", "AGGREGATE_DTYPE", "CHUNK_HEADER_DTYPE",
    "SIDE_STRING", "SIDE_JSON", "SIDE_PRM_COMMAND", "SIDE_WQE_BYTES", "SIDE_BLOB", "VERSION",
    "Capture", "Chunk", "Loss", "ProcessInfo", "SideRecord", "capture_files", "iter_chunks", "read_capture",
    "TraceWriter", "chunk_bytes",
]
