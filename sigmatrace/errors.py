"""Exception types.  Every user-facing failure derives from SigmatraceError."""


class SigmatraceError(Exception):
    """Base class of every error sigmatrace raises on purpose."""


class TraceFormatError(SigmatraceError):
    """A capture file is corrupt, of an unsupported version, or not a capture.

    Always carries the file and byte offset where decoding stopped, so a user
    can tell which process file is damaged and where.  Truncation at the end of
    a file is *not* an error: the reader keeps every complete chunk and reports
    the lost tail in ``Capture.losses``.
    """

    def __init__(self, message: str, path=None, offset=None):
        self.path = None if path is None else str(path)
        self.offset = offset
        self.reason = message
        where = []
        if self.path is not None:
            where.append(self.path)
        if offset is not None:
            where.append(f"offset {offset}")
        super().__init__(f"{': '.join([', '.join(where), message]) if where else message}")
