"""sigmatrace_sim — a SimPy testbed of GPU-initiated (IBGDA) and CPU-proxy RDMA.

GPUs post genuine mlx5 WQEs into send-queue rings and ring 8-byte doorbells;
mlx5 NICs honour the producer index, fetch WQEs, move bytes over a fabric
and post CQEs; the tracer's hijack poller observes, records and forwards
each doorbell and recovers WQEs.  Every process writes what the native
tracer would have written (trace format v1), and the model writes the ground
truth beside it.  See docs/model.md.
"""
from .params import Timing, TracerConfig
from .cluster import Cluster, SimResult

__all__ = ["Timing", "TracerConfig", "Cluster", "SimResult", "run_workload", "WORKLOADS"]


def run_workload(name, output, **kwargs):
    """Run workload `name` and write `output` (+ ground truth); returns SimResult."""
    from .workloads import run
    return run(name, output, **kwargs)


def __getattr__(name):
    if name == "WORKLOADS":
        from .workloads import WORKLOADS
        return WORKLOADS
    raise AttributeError(name)
