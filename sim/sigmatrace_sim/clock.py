"""Per-node clocks: invariant TSC with its own frequency error, offset and drift,
and the wall clocks the tracer pairs it with (CLOCK_MONOTONIC_RAW, CLOCK_REALTIME
disciplined by PTP with a residual error, CLOCK_TAI).

True (simulated) time t is nanoseconds since the job started.
  tsc(t)      = tsc0 + t * nominal_hz * (1 + drift_ppm * 1e-6) / 1e9
  realtime(t) = epoch_ns + t + ptp_error_ns          (what this node's CLOCK_REALTIME reads)
The tracer does not know drift; it records tsc_hz = nominal_hz (what it measured at
start) and calibration pairs, from which the correlator must recover the truth.
"""
from dataclasses import dataclass, asdict

import numpy as np

from sigmatrace.format import layout as L

JOB_EPOCH_NS = 1_780_000_000_000_000_000  # a fixed wall-clock start (2026), deterministic captures
TAI_OFFSET_NS = 37_000_000_000


@dataclass
class NodeClock:
    node: int
    nominal_hz: float      # TSC frequency the tracer reports (measured)
    drift_ppm: float       # true TSC rate error vs true time
    tsc0: int              # TSC value at true time 0
    ptp_error_ns: float    # CLOCK_REALTIME error vs true time (PTP residual)
    mono0_ns: int          # CLOCK_MONOTONIC_RAW at true time 0 (boot time of the node)

    @property
    def ticks_per_ns(self):
        return self.nominal_hz * (1.0 + self.drift_ppm * 1e-6) / 1e9

    def tsc(self, t_ns):
        return int(self.tsc0 + t_ns * self.ticks_per_ns)

    def tsc_array(self, t_ns):
        t = np.asarray(t_ns, dtype=np.float64)
        return (np.uint64(self.tsc0) + (t * self.ticks_per_ns).astype(np.uint64)).astype(np.uint64)

    def calibration(self, t_ns, point, read_ns=18.0):
        """One calibration record as the tracer takes it (TSC read before and after the clock reads)."""
        rec = np.zeros(1, L.CALIBRATION_DTYPE)
        rec["tsc_before"] = self.tsc(t_ns)
        rec["tsc_after"] = self.tsc(t_ns + read_ns)
        mid = t_ns + read_ns / 2
        rec["monotonic_raw_ns"] = int(self.mono0_ns + mid * (1.0 + self.drift_ppm * 1e-6))
        rt = int(JOB_EPOCH_NS + mid + self.ptp_error_ns)
        rec["realtime_ns"] = rt
        rec["tai_ns"] = rt + TAI_OFFSET_NS
        rec["point"] = point
        rec["flags"] = L.CALIB_F_TAI_VALID | L.CALIB_F_PTP | L.CALIB_F_INVARIANT_TSC
        return rec

    def to_dict(self):
        return asdict(self)


def make_clocks(n_nodes, rng, drift_ppm=20.0, ptp_error_ns=150.0, same_clock=False):
    """Clocks for n nodes.  drift up to ±drift_ppm, PTP residual ~ N(0, ptp_error_ns)."""
    clocks = []
    for n in range(n_nodes):
        if same_clock:
            clocks.append(NodeClock(n, 2.0e9, 0.0, 10**12, 0.0, 10**12))
            continue
        nominal = float(rng.choice([2.0e9, 2.1e9, 2.4e9, 2.6e9]))
        clocks.append(NodeClock(
            node=n,
            nominal_hz=nominal,
            drift_ppm=float(rng.uniform(-drift_ppm, drift_ppm)),
            tsc0=int(rng.integers(10**12, 10**14)),
            ptp_error_ns=float(rng.normal(0.0, ptp_error_ns)),
            mono0_ns=int(rng.integers(10**11, 10**13)),
        ))
    return clocks
