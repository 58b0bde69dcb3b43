"""Progress of a command's long stages, each with its total (decode 3/8 files, perfetto 120k/500k events, simulate
40/200 iterations): tqdm bars on stderr when stderr is a terminal, nothing at all otherwise or when quiet (-q).

One object per command run; the layers that do the work take it as a callback ``progress(stage, n=0, total=None,
unit="")``: a new stage name (with its total) starts a bar and ends the previous one, ``n`` advances it.  The
callers never ask whether anything is shown.
"""
import shutil
import sys


class Progress:
    def __init__(self, quiet=False, file=None):
        self.file = file if file is not None else sys.stderr
        try:
            tty = self.file.isatty()
        except (AttributeError, ValueError):
            tty = False
        self.enabled = bool(tty and not quiet)
        # a terminal that reports no size (a bare pty) still gets a bar: tqdm draws nothing at size 0
        size = shutil.get_terminal_size((100, 24))
        self.ncols, self.nrows = size.columns or 100, size.lines or 24
        self.stage = None
        self._bar = None

    def __call__(self, stage, n=0, total=None, unit=""):
        if stage != self.stage:
            self.close()
            self.stage = stage
            if self.enabled:
                from tqdm import tqdm
                self._bar = tqdm(total=total, desc=stage, unit=unit or "it", leave=False, file=self.file,
                                 ncols=self.ncols, nrows=self.nrows)
        elif total is not None and self._bar is not None and self._bar.total != total:
            self._bar.total = total
            self._bar.refresh()
        if n and self._bar is not None:
            self._bar.update(n)

    def close(self):
        """End the current stage's bar."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self.stage = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


QUIET = Progress(quiet=True)    # for callers given no progress: shows nothing
