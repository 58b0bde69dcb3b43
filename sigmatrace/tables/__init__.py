"""Tables (layer 4): the correlated tables written as Parquet, checked against ``sigmatrace.schema``.

``parquet.write_tables`` writes every table (the per-record ones as directories of part files, in
parallel); ``parquet.arrow_table`` gives one table as Arrow; ``host_events`` keeps the host-layer events
the Perfetto window may draw while the events table is streamed.
"""
from .parquet import DIR_TABLES, TABLES, SchemaMismatch, arrow_table, conform, write_events, write_tables

__all__ = ["write_tables", "write_events", "arrow_table", "conform", "SchemaMismatch", "TABLES", "DIR_TABLES"]
