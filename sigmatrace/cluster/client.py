"""Where the cluster report runs: a running Dask scheduler (its address, or the scheduler file that
``dask scheduler --scheduler-file`` / dask-mpi write), or ``local:N``, a LocalCluster of N worker processes
on this machine.  Every failure to get one is a one-line ``SigmatraceError``."""
from __future__ import annotations

import logging
import re
from pathlib import Path

from ..errors import SigmatraceError

LOCAL = re.compile(r"^local:(\d+)$")
CONNECT_TIMEOUT = "30s"


def parse(spec):
    """``spec`` checked: 'local:N' (N >= 1), a scheduler file, or a scheduler address."""
    spec = str(spec).strip()
    m = LOCAL.match(spec)
    if spec.startswith("local:") and (not m or int(m.group(1)) < 1):
        raise SigmatraceError(f"--cluster {spec}: local:N needs a number of workers N >= 1")
    if not spec:
        raise SigmatraceError("--cluster needs a scheduler address, a scheduler file or local:N")
    return spec


def _distributed():
    try:
        import distributed
    except ImportError:
        raise SigmatraceError("--cluster needs Dask's distributed scheduler: pip install 'sigmatrace[cluster]'") \
            from None
    return distributed


def connect(spec):
    """(client, close): a Dask client for ``spec`` and what ends it (the LocalCluster it started, if any)."""
    spec = parse(spec)
    distributed = _distributed()
    m = LOCAL.match(spec)
    try:
        if m:
            cluster = distributed.LocalCluster(n_workers=int(m.group(1)), threads_per_worker=1, processes=True,
                                               dashboard_address=":0", silence_logs=logging.ERROR)
            client = distributed.Client(cluster)

            def close():
                client.close()
                cluster.close()
            return client, close
        if Path(spec).is_file():
            client = distributed.Client(scheduler_file=spec, timeout=CONNECT_TIMEOUT)
        else:
            client = distributed.Client(spec, timeout=CONNECT_TIMEOUT)
    except (OSError, TimeoutError, ValueError) as e:
        raise SigmatraceError(f"--cluster {spec}: cannot reach the Dask scheduler ({type(e).__name__}: {e})") from None
    return client, client.close


def dashboard_link(client):
    try:
        return client.dashboard_link
    except Exception:   # noqa: BLE001 -- no dashboard (bokeh missing): nothing to show
        return None
