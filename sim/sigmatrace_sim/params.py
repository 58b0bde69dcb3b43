"""Model parameters: hardware latencies (Timing) and tracer settings (TracerConfig).

All times are nanoseconds of simulated (true) time; bandwidths are bytes/ns
(1 byte/ns = 8 Gb/s).  Defaults are plausible for an H200 + ConnectX-7 node
on NDR InfiniBand; they are inputs, not results.
"""
from dataclasses import dataclass, asdict, field

HIJACK_MODES = ("baseline", "forward", "recovery", "nonblocking")
TRACE_MODES = ("aggregate", "simple", "full")


@dataclass
class Timing:
    # GPU side (one NVSHMEM-style call on one thread/warp)
    gpu_issue_ns: float = 5000.0        # API entry, address translation, slot reservation (atomicAdd)
    wqe_store_ns: float = 90.0          # per WQEBB written to the SQ ring (st.relaxed 16B stores)
    dbr_store_ns: float = 60.0          # st.release of the DBR word
    db_store_ns: float = 60.0           # issue of the 8-byte st.release to the UAR mapping
    mmio_write_ns: float = 650.0        # PCIe posted write GPU -> NIC BAR (or -> hijacked host page)
    gpu_poll_ns: float = 900.0          # one CQ / memory polling round trip of the GPU
    gpu_work_ns_per_edge: float = 2.0   # BFS local edge work (per GPU, parallel threads folded in)
    # NIC
    nic_db_ns: float = 150.0            # UAR doorbell decode and QP scheduling
    nic_fetch_ns: float = 950.0         # DMA read of WQEs from GPU memory (latency)
    nic_fetch_ns_per_wqebb: float = 6.0
    nic_exec_ns: float = 45.0           # per WQE (message rate ~ 22 M/s per NIC)
    nic_pcie_write_ns: float = 700.0    # NIC DMA write into (remote) GPU memory
    nic_pcie_read_ns: float = 950.0     # NIC DMA read from (remote) GPU memory (RDMA READ responder)
    nic_atomic_ns: float = 1100.0       # PCIe atomic / read-modify-write at the responder
    cqe_write_ns: float = 600.0         # CQE DMA into the (GPU-resident) CQ ring
    # fabric
    link_bw: float = 50.0               # bytes/ns (400 Gb/s NDR)
    link_latency_ns: float = 250.0      # cable + serdes, per direction per hop
    switch_latency_ns: float = 200.0
    loopback_ns: float = 300.0          # same-NIC loopback
    header_bytes: int = 66              # IB LRH+BTH+RETH+ICRC per message (per MTU folded in)
    # host: the tracer's hijack poller
    poller_wakeup_ns: float = 250.0     # spin/UMWAIT wake-up after the doorbell page changes
    poller_check_ns: float = 40.0       # re-check of the page when the poller was busy
    poller_record_ns: float = 45.0      # TSC read + thread-local record
    poller_forward_ns: float = 300.0    # CPU MMIO store of the 8 bytes to the real UAR
    recovery_enqueue_ns: float = 4200.0  # per doorbell: cudaMemcpyAsync submission on the copy stream
    copy_latency_ns: float = 4000.0     # D2H copy start + stream synchronize
    copy_bw: float = 20.0               # bytes/ns PCIe D2H
    parse_ns_per_wqe: float = 70.0
    # CPU proxy (NCCL-style verbs)
    cpu_post_ns: float = 250.0          # ibv_post_send (inline, no syscall)
    cpu_poll_ns: float = 90.0           # one ibv_poll_cq call
    cpu_record_ns: float = 25.0         # tracer cost per recorded event

    def to_dict(self):
        return asdict(self)


@dataclass
class TracerConfig:
    mode: str = "simple"                # aggregate | simple | full (verbs layer)
    hijack: str = "recovery"            # baseline | forward | recovery | nonblocking
    batch_threshold: int = 128          # WQEBBs accumulated before the copy+parse batch
    poller_wakeup_ns: float = None      # overrides Timing.poller_wakeup_ns
    record_after_ns: float = 0.0        # doorbell recording starts at this true time (warm-up excluded)
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.mode not in TRACE_MODES:
            raise ValueError(f"mode must be one of {TRACE_MODES}")
        if self.hijack not in HIJACK_MODES:
            raise ValueError(f"hijack must be one of {HIJACK_MODES}")

    @property
    def recovery(self):
        return self.hijack in ("recovery", "nonblocking")

    @property
    def hijacked(self):
        return self.hijack != "baseline"
