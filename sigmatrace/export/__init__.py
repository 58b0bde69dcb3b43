"""Exports (F17): Perfetto protobuf, summary.json, Parquet tables."""
from .perfetto import write_perfetto
from .summary import build_summary, write_summary
from .tables import TABLES, arrow_table, write_tables

__all__ = ["write_perfetto", "build_summary", "write_summary", "write_tables", "arrow_table", "TABLES"]
