"""Helpers shared by the workloads."""
from ..params import Timing, TracerConfig


def tracer_from(mode="simple", hijack="recovery", batch_threshold=128, poller_wakeup_ns=None, record_after_ns=0.0):
    return TracerConfig(mode=mode, hijack=hijack, batch_threshold=int(batch_threshold),
                        poller_wakeup_ns=poller_wakeup_ns, record_after_ns=record_after_ns)


def timing_from(overrides=None):
    t = Timing()
    for k, v in (overrides or {}).items():
        if not hasattr(t, k):
            raise KeyError(f"unknown timing parameter {k}")
        setattr(t, k, float(v))
    return t
