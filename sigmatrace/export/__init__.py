"""Export (layer 5): the Perfetto protobuf timeline (F17).  Tables: ``sigmatrace.tables``; summary.json and
figures: ``sigmatrace.report``."""
from .perfetto import write_perfetto

__all__ = ["write_perfetto"]
