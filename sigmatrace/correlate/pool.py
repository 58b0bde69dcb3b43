"""Worker pool of the correlator's decode stage: every capture file (byte ranges of large ones) decoded in
parallel, results handed back through shared memory; and the heap hygiene between stages.

``decode_all`` runs ``decode.decode_file`` on nw - 1 pool processes plus this one; a pool result's numpy
buffers come back through one /dev/shm file (``_pack`` / ``_unpack``) instead of the result pipe.
"""
from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor

from ..decode import DEFAULT_BATCH_RECORDS, decode_file, finish_warnings, merge_ranges, open_buffer
from ..format.reader import chunk_spans, repeat_warning, repeated_from


def _decode_task(task):
    path, start, stop, batch_records = task
    return decode_file(path, start, stop, batch_records)


class _Packed:
    """A pool worker's result whose array buffers wait in a shared-memory file (see ``_pack``)."""
    __slots__ = ("data", "path", "offs")

    def __init__(self, data, path, offs):
        self.data, self.path, self.offs = data, path, offs


SHM_DIR = "/dev/shm"
_PACK_MIN = 1 << 20           # results with less array data go through the pipe
_MAP_MIN = 1 << 16            # arrays this large are mapped, smaller ones copied
_PAGE = 1 << 16               # offset alignment of mapped arrays (a multiple of mmap.ALLOCATIONGRANULARITY)


def _decode_task_packed(task):
    """Pool worker: ``_decode_task``, its arrays handed back through one shared-memory file (``_pack``)."""
    return _pack(_decode_task(task))


def _pack(obj):
    """Pickle protocol 5 with the numpy buffers out of band, written to one file in /dev/shm: the result
    pipe of a process pool moves ~0.35 GB/s on a small VM, a tmpfs file + mmap several GB/s.  Falls back to
    the object itself (pickled through the pipe) when the buffers are small or the file cannot be written."""
    import pickle
    import tempfile
    bufs = []
    try:
        data = pickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
        raws = [b.raw() for b in bufs]
    except (pickle.PicklingError, BufferError, ValueError):
        return obj
    if sum(m.nbytes for m in raws) < _PACK_MIN or not os.path.isdir(SHM_DIR):
        return obj
    path = None
    try:
        fd, path = tempfile.mkstemp(prefix="sigmatrace-decode-", dir=SHM_DIR)
        offs, pos = [], 0
        with os.fdopen(fd, "wb") as f:
            for m in raws:
                # large buffers start on a page (each is mapped on its own: freeing one array unmaps it)
                pad = -pos % (_PAGE if m.nbytes >= _MAP_MIN else 64)
                f.write(b"\0" * pad)
                pos += pad
                offs.append((pos, m.nbytes))
                f.write(m)
                pos += m.nbytes
    except OSError:
        if path is not None:
            try:
                os.unlink(path)
            except OSError:
                pass
        return obj
    return _Packed(data, path, offs)


def _unpack(r):
    """The main process's side of ``_pack``: map the file copy-on-write (arrays stay writable), unlink it."""
    if not isinstance(r, _Packed):
        return r
    import mmap
    import pickle
    bufs = []
    try:
        with open(r.path, "rb") as f:
            fd = f.fileno()
            for o, n in r.offs:
                if n >= _MAP_MIN:    # one private mapping per large array: it lives (and is unmapped) with it
                    bufs.append(mmap.mmap(fd, n, offset=o, access=mmap.ACCESS_COPY))
                else:                # small ones (chunk index, calibration ...) copied: they pin no mapping
                    b = bytearray(n)
                    if n and os.preadv(fd, [b], o) != n:
                        raise OSError(f"{r.path}: short read")
                    bufs.append(b)
    finally:
        try:
            os.unlink(r.path)
        except OSError:
            pass
    return pickle.loads(r.data, buffers=bufs)


def _discard(fut):
    """Remove the shared-memory file of a result that was never unpacked."""
    try:
        r = fut.result(timeout=0) if fut.done() else None
    except Exception:   # noqa: BLE001 - a failed task has no file
        return
    if isinstance(r, _Packed):
        try:
            os.unlink(r.path)
        except OSError:
            pass


SPLIT_MIN_BYTES = 32 << 20   # files larger than this are split into ranges when workers would idle


def decode_all(paths, workers, progress, batch_records=DEFAULT_BATCH_RECORDS, warnings=None):
    """Decode every file (ranges of large files in parallel); results in file order.  A file that holds
    its processes twice (``format.reader.repeated_from``) is decoded up to the repeat, with a warning."""
    if workers is None:
        workers = os.cpu_count() or 1
    workers = max(1, int(workers))
    tasks = []
    for p in paths:
        end = None
        try:
            rep = repeated_from(p, open_buffer(str(p)))
        except (OSError, ValueError):
            rep = None
        if rep is not None:
            if warnings is not None:
                warnings.append(repeat_warning(p, rep))
            end = rep[0] if rep[3] else None
        spans = [(0, end)]
        if workers > 1 and len(paths) < workers:
            try:
                size = os.path.getsize(p)
            except OSError:
                size = 0
            if size >= SPLIT_MIN_BYTES:
                try:
                    buf = open_buffer(str(p))
                    spans = chunk_spans(p, max(1, -(-workers // len(paths))), data=buf if end is None else buf[:end])
                    del buf
                except (OSError, ValueError):
                    spans = [(0, end)]
        for a, b in spans:
            tasks.append((str(p), a, b, batch_records))
    nw = max(1, min(workers, len(tasks)))
    parts = {}
    if nw == 1:
        it = map(_decode_task, tasks)
        ex = None
    else:
        # nw - 1 pool processes plus this one: every nw-th task (largest first) is decoded here, so one
        # share of the results never has to be pickled across processes
        ex = ProcessPoolExecutor(max_workers=nw - 1)
        sizes = []
        for t in tasks:
            try:
                sizes.append((t[2] if t[2] is not None else os.path.getsize(t[0])) - t[1])
            except OSError:
                sizes.append(0)
        order = sorted(range(len(tasks)), key=lambda k: -sizes[k])
        mine = set(order[::nw])
        futs = {k: ex.submit(_decode_task_packed, tasks[k]) for k in order if k not in mine}
        local = {k: _decode_task(tasks[k]) for k in order if k in mine}
        it = (local[k] if k in local else _unpack(futs.pop(k).result()) for k in range(len(tasks)))
    try:
        for t, r in zip(tasks, it):
            parts.setdefault(t[0], []).append(r)
            if progress and len(parts[t[0]]) == sum(1 for x in tasks if x[0] == t[0]):
                progress(1)
    finally:
        if ex is not None:
            ex.shutdown()
            for f in futs.values():     # results not taken (an error above): their files
                _discard(f)
    return [finish_warnings(merge_ranges(parts[str(p)])) for p in paths]


_LIBC = None


def trim():
    """glibc: hand the heap's free pages back (malloc_trim).  The correlator frees many per-batch and
    per-process arrays whose holes later large (mmapped) arrays cannot reuse; trimming at stage boundaries
    keeps them out of the peak RSS (~20 % on big captures) at no per-allocation cost."""
    global _LIBC
    if os.environ.get("SIGMATRACE_NO_TRIM"):
        return
    try:
        if _LIBC is None:
            import ctypes
            _LIBC = ctypes.CDLL("libc.so.6")
        _LIBC.malloc_trim(0)
    except (OSError, AttributeError):
        _LIBC = False


_MEMTRACE = os.environ.get("SIGMATRACE_MEMTRACE")
_MEMTRACE_T = [None]


def memtrace(label):
    """Debug aid: SIGMATRACE_MEMTRACE=1 prints the resident set size at each correlator stage, with the wall,
    user and system seconds and the page faults since the previous stage."""
    if _MEMTRACE:
        import resource
        import time
        now = time.perf_counter()
        ru = resource.getrusage(resource.RUSAGE_SELF)
        last, lu, ls, lf = _MEMTRACE_T[0] or (now, ru.ru_utime, ru.ru_stime, ru.ru_minflt)
        _MEMTRACE_T[0] = (now, ru.ru_utime, ru.ru_stime, ru.ru_minflt)
        with open("/proc/self/statm") as f:
            print(f"[memtrace] {label}: {int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 2**20:.0f} MiB"
                  f" (+{now - last:.2f} s; user {ru.ru_utime - lu:.2f} s, sys {ru.ru_stime - ls:.2f} s, "
                  f"{ru.ru_minflt - lf} faults)", flush=True)
