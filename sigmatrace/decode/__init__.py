"""Decode (layer 2): capture files -> per-process metadata, side records and narrow per-type columns.

``columns.decode_file`` decodes one file (or byte range of one) in a worker, with the C kernel
(``kernel``, libsigmatrace_decode.so) when it is built and a numpy path that gives identical results
otherwise; ``types`` says which record types and columns the correlator keeps; ``store.EventStore``
merges the per-process outputs.  Chunk framing and its error rules are ``format.reader``'s.
"""
from .columns import (FileDecode, ProcDecode, decode_file, finish_warnings, iter_event_batches, merge_ranges,
                      open_buffer)
from .store import EventStore
from .types import CORRELATOR_TYPES, DEFAULT_BATCH_RECORDS, TYPE_COLUMNS

__all__ = ["decode_file", "finish_warnings", "iter_event_batches", "merge_ranges", "open_buffer", "FileDecode",
           "ProcDecode", "EventStore", "CORRELATOR_TYPES", "DEFAULT_BATCH_RECORDS", "TYPE_COLUMNS"]
