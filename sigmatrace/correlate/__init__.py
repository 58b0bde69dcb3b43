"""Correlator (F16, F24a, F24b): capture files -> one time base, QP topology, doorbell<->WQE
association, matched operations, completions, flows, barriers.  See core.py."""
from .core import Correlated, correlate
from .clock import NodeClock

__all__ = ["correlate", "Correlated", "NodeClock"]
