"""Reports of captures beyond one machine on a Dask cluster (F26): ``sigmatrace report --cluster``.

The layer between the analyses and the report: it runs the correlator's per-process stages as Dask tasks
next to each process file (``shard``; shared filesystem assumed) and its global stages on compact columns in
the driver (``driver``), and writes the same tables, summary inputs and Perfetto window as the local report.
Dask (``pip install 'sigmatrace[cluster]'``) is imported only here, when a cluster is asked for
(``client.connect``); the local report needs none.  docs/cluster.md: how to run it under Slurm, memory per
worker.
"""
from .client import connect, dashboard_link
from .driver import correlate_and_write

__all__ = ["connect", "dashboard_link", "correlate_and_write"]
