"""Report (layer 7): a capture -> a report directory (``build_report``), summary.json (``summary``),
figures, and the cache of reported captures behind ``sigmatrace query CAPTURE`` (``cache``)."""
from .build import build_report
from .cache import cache_dir_for, connect, ensure_report
from .summary import build_summary, write_summary

__all__ = ["build_report", "build_summary", "write_summary", "ensure_report", "cache_dir_for", "connect"]
