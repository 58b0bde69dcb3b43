"""sigmatrace: library-agnostic RDMA tracing for CPU- and GPU-initiated communication.

Layers, one package each:
  format/    trace format v1: reader and writer (docs/format.md)
  mlx5/      mlx5 WQE, doorbell, CQE and PRM command decoding (and encoding)
  correlate/ merge per-thread files, time base, QP topology, doorbell<->WQE association
  export/    Perfetto, JSON aggregates, Parquet tables, figures
  query/     SQL over correlated tables
  cli/       the `sigmatrace` command
The SimPy testbed is the separate package `sigmatrace_sim` (source folder sim/).
"""
from .errors import TraceFormatError, SigmatraceError

__version__ = "0.1.0"
__all__ = ["TraceFormatError", "SigmatraceError", "__version__"]
