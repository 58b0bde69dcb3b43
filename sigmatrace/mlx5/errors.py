"""The one exception the mlx5 decoders raise for malformed input."""
from __future__ import annotations

from ..errors import SigmatraceError


class Mlx5DecodeError(SigmatraceError, ValueError):
    """Bytes that cannot be a valid mlx5 WQE, CQE, doorbell or PRM command.

    Raised by the single-object decoders (``parse_wqe``, ``parse_cqe``,
    ``parse_create_qp``, ...) for: a buffer too short for what its own header
    announces, DS = 0, an opcode outside the reference table, a segment layout
    that does not fit the DS (e.g. inline data running past the WQE), or an
    extended-atomic opmod the reference does not define.  ``offset`` is the
    byte offset in the caller's buffer where the offending object starts.

    ``walk_send_queue`` never raises it: it records each such slot as a
    ``WalkProblem`` instead.  It is a ``ValueError`` so callers that treat bad
    input generically keep working.
    """

    def __init__(self, message: str, offset: int | None = None):
        self.offset = offset
        self.reason = message
        super().__init__(message if offset is None else f"at byte {offset}: {message}")
