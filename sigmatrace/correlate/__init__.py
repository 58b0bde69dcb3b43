"""Correlator (layer 3, F16, F24a, F24b): capture files -> one time base, QP topology, doorbell <-> WQE
association, matched operations, completions, flows, barriers.  The stages: see ``pipeline``."""
from .clock import NodeClock
from .pipeline import correlate
from .result import Correlated

__all__ = ["correlate", "Correlated", "NodeClock"]
