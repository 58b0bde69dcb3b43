"""Who is who: processes, nodes and ranks from the process headers; threads and the GPU each hijack poller
serves; global GPU ids; NIC identities (node GUID, GIDs, LIDs) that the QP topology resolves remote QPs with.

Nodes are keyed by the header's ``node_id`` (else ``host``): several emulated nodes on one host stay apart.
A GPU is one per (node, uuid); its owner is the process that rings its doorbells.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from ..format.reader import untraced_libraries
from .util import lookup, pq_key


@dataclass
class Nodes:
    """Process -> node, rank; node labels."""
    node_of: np.ndarray      # node of each process
    ranks: np.ndarray        # rank of each process (-1 unknown)
    labels: list             # label of each node
    count: int


def _header(p):
    return p.header or {}


def processes_and_nodes(out, st, procs) -> Nodes:
    """Nodes and ranks of the processes, warnings about duplicated / missing ranks; the processes table."""
    nproc = len(procs)
    node_key, node_of = {}, np.zeros(nproc, np.int64)
    ranks = np.full(nproc, -1, np.int64)
    for i, p in enumerate(procs):
        h = _header(p)
        key = h.get("node_id") if h.get("node_id") not in (None, "") else h.get("host")
        if key is None:
            key = f"unknown-{p.uid:x}"
        key = str(key)
        if key not in node_key:
            node_key[key] = len(node_key)
        node_of[i] = node_key[key]
        r = h.get("rank")
        ranks[i] = int(r) if isinstance(r, (int, float)) or (isinstance(r, str) and r.lstrip("-").isdigit()) else -1
    labels = [None] * len(node_key)
    for i, p in enumerate(procs):
        n = node_of[i]
        if labels[n] is None:
            labels[n] = str(_header(p).get("host") or next(k for k, v in node_key.items() if v == n))
    if len(set(labels)) < len(labels):
        # several nodes on one host (SIGMATRACE_NODE_ID per process, emulated nodes): their node ids
        # are the distinct names; host#k only where a node id is just the host name
        keys = [None] * len(node_key)
        for k, v in node_key.items():
            keys[v] = k
        dup = {lab for lab in labels if labels.count(lab) > 1}
        labels = [(keys[k] if keys[k] != lab and keys[k] not in labels else f"{lab}#{k}") if lab in dup else lab
                  for k, lab in enumerate(labels)]
    out.node_labels = labels
    rk, cnt = np.unique(ranks[ranks >= 0], return_counts=True)
    for r in rk[cnt > 1]:
        who = [procs[i].path for i in np.flatnonzero(ranks == r)]
        out.warnings.append(f"rank {int(r)} appears in {len(who)} processes ({', '.join(sorted(set(who)))}); "
                            f"kept apart by process uid")
    ranks[ranks < 0] = -1
    # libraries loaded but not traced (provider disabled or not built): the report says what to do
    out.stats["untraced_libraries"] = untraced_libraries([_header(p) for p in procs])
    sizes = {int(_header(p).get("world_size") or 0) for p in procs}
    sizes.discard(0)
    if sizes:
        world = max(sizes)
        missing = sorted(set(range(world)) - set(int(r) for r in ranks if r >= 0))
        if missing:
            out.warnings.append(f"world_size is {world} but ranks {missing[:16]}{'…' if len(missing) > 16 else ''} "
                                f"have no process file; their traffic is seen only from their peers")
    dropped = np.zeros(nproc, np.int64)
    drops = st.table("DROPS")
    np.add.at(dropped, drops["process"].astype(np.int64), drops["dropped"].astype(np.int64))
    for i, p in enumerate(procs):
        dropped[i] = max(dropped[i], int((p.end or {}).get("dropped_events", 0) or 0))
    out.tables["processes"] = dict(
        process=np.arange(nproc, dtype=np.int64),
        uid=np.array([f"{p.uid:016x}" for p in procs], dtype=object),
        path=np.array([p.path for p in procs], dtype=object),
        host=np.array([str(_header(p).get("host", "")) for p in procs], dtype=object),
        node=node_of,
        node_label=np.array([labels[n] for n in node_of], dtype=object),
        rank=ranks,
        pid=np.array([int(_header(p).get("pid") or -1) for p in procs], np.int64),
        mode=np.array([str(_header(p).get("mode", "")) for p in procs], dtype=object),
        complete=np.array([p.end is not None for p in procs]),
        has_header=np.array([p.header is not None for p in procs]),
        events=np.array([p.n_events for p in procs], np.int64),
        dropped_events=dropped,
        tsc_hz=np.array([float(_header(p).get("tsc_hz") or 0) for p in procs]),
        gpus=np.array([json.dumps(_header(p).get("gpus", [])) for p in procs], dtype=object),
        nics=np.array([json.dumps(_header(p).get("nics", [])) for p in procs], dtype=object),
    )
    return Nodes(node_of=node_of, ranks=ranks, labels=labels, count=len(node_key))


@dataclass
class Pollers:
    """The hijack's DB_HIJACK_INSTALL records: which thread polls which GPU's doorbell page."""
    records: dict            # the DB_HIJACK_INSTALL columns
    gpu: np.ndarray          # GPU ordinal per record (side JSON may override the record's)
    page: np.ndarray         # page id per record
    thread_key: np.ndarray   # pq_key(process, thread) per record

    def gpu_of_threads(self, process, thread):
        """GPU ordinal of the hijack thread (process, thread) of each row; -1 elsewhere."""
        return lookup(self.thread_key, self.gpu, pq_key(process, thread))


def threads(out, st, procs, node_of) -> Pollers:
    """The threads table (process files' thread records, plus hijack pollers without one)."""
    install = st.table("DB_HIJACK_INSTALL")
    rows = []
    for i, p in enumerate(procs):
        for ti, info in sorted(p.threads.items()):
            rows.append((i, int(ti), int(info.get("tid") or -1), str(info.get("name", "")), str(info.get("role", ""))))
    pollers = Pollers(records=install, gpu=install["gpu"].astype(np.int64), page=install["page_id"].astype(np.int64),
                      thread_key=pq_key(install["process"], install["thread"]))
    for k in range(len(install["tsc"])):       # side JSON may override the GPU and the page
        js = procs[int(install["process"][k])].side_json.get(int(install["side_id"][k]))
        if isinstance(js, dict):
            if js.get("gpu") is not None:
                pollers.gpu[k] = int(js["gpu"])
            if js.get("page_id") is not None:
                pollers.page[k] = int(js["page_id"])
    known = {(a, b) for a, b, *_ in rows}
    for k in range(len(install["tsc"])):
        key = (int(install["process"][k]), int(install["thread"][k]))
        if key not in known:
            rows.append((key[0], key[1], -1, "", "poller"))
            known.add(key)
    rows.sort()
    th_proc = np.array([r[0] for r in rows], np.int64)
    th_idx = np.array([r[1] for r in rows], np.int64)
    th_gpu = pollers.gpu_of_threads(th_proc, th_idx) if rows else np.zeros(0, np.int64)
    out.tables["threads"] = dict(process=th_proc, thread=th_idx, tid=np.array([r[2] for r in rows], np.int64),
                                 name=np.array([r[3] for r in rows], dtype=object),
                                 role=np.array([r[4] for r in rows], dtype=object), gpu_ordinal=th_gpu,
                                 node=node_of[th_proc] if rows else np.zeros(0, np.int64))
    return pollers


class Gpus:
    """Global GPU ids: (process, ordinal) -> gpu; a uuid shared by processes of one node is one GPU."""

    def __init__(self, procs, nodes: Nodes):
        self.procs, self.nodes = procs, nodes
        self.by_key = {}
        self.rows = []

    def id(self, proc_i, ordinal, use=True):
        """The GPU of ``ordinal`` in process ``proc_i``; ``use``: that process rings its doorbells (owns it)."""
        key = (proc_i, ordinal)
        ranks = self.nodes.ranks
        if key in self.by_key:
            gpu = self.by_key[key]
            if use and not self.rows[gpu]["used"]:
                self.rows[gpu].update(process=proc_i, rank=int(ranks[proc_i]), used=True)
            return gpu
        uuid = None
        for g in _header(self.procs[proc_i]).get("gpus", []) or []:
            if isinstance(g, dict) and int(g.get("ordinal", -99)) == ordinal:
                uuid = g.get("uuid")
        node = int(self.nodes.node_of[proc_i])
        for gpu, row in enumerate(self.rows):
            if uuid and row["uuid"] == uuid and row["node"] == node:
                self.by_key[key] = gpu
                if use and not row["used"]:
                    row.update(process=proc_i, rank=int(ranks[proc_i]), used=True)
                return gpu
        gpu = len(self.rows)
        self.rows.append(dict(gpu=gpu, node=node, process=proc_i, rank=int(ranks[proc_i]), ordinal=ordinal,
                              uuid=uuid or "", used=use))
        self.by_key[key] = gpu
        return gpu

    def register(self, pollers: Pollers):
        """The GPUs whose doorbells are polled (owned), then every GPU the headers list (not owned)."""
        for k in range(len(pollers.gpu)):
            self.id(int(pollers.records["process"][k]), int(pollers.gpu[k]))
        for i, p in enumerate(self.procs):
            for g in _header(p).get("gpus", []) or []:
                if isinstance(g, dict) and g.get("ordinal") is not None:
                    self.id(i, int(g["ordinal"]), use=False)

    def table(self):
        rows, labels = self.rows, self.nodes.labels
        return dict(gpu=np.array([g["gpu"] for g in rows], np.int64), node=np.array([g["node"] for g in rows], np.int64),
                    process=np.array([g["process"] for g in rows], np.int64),
                    rank=np.array([g["rank"] for g in rows], np.int64),
                    ordinal=np.array([g["ordinal"] for g in rows], np.int64),
                    uuid=np.array([g["uuid"] for g in rows], dtype=object),
                    label=np.array([f"{labels[g['node']]}/gpu{g['ordinal']}" + (f"@r{g['rank']}" if g["rank"] >= 0 else "")
                                    for g in rows], dtype=object))


def norm_gid(g):
    """A GID as 32 lower-case hex digits, or None (absent or all zero)."""
    if g is None:
        return None
    if isinstance(g, int):
        return f"{g:032x}" if g else None
    s = str(g).lower().replace(":", "").replace("0x", "")
    if not s.strip("0"):
        return None
    return s.zfill(32)


def norm_guid(g):
    """A node GUID as 16 lower-case hex digits, or None."""
    if g is None:
        return None
    if isinstance(g, int):
        return f"{g:016x}"
    s = str(g).lower().replace(":", "").replace("0x", "")
    return s.zfill(16) if s.strip("0") else None


class Nics:
    """NICs from the headers (one per node GUID, else per node and device name) and the port addresses
    (GIDs, LIDs) they answer to."""

    def __init__(self, procs, node_of):
        self.node_of = node_of
        self.rows = []           # (nic, process, node, name, guid)
        self.by_gid, self.by_lid = {}, {}
        self.of_process = {}     # process -> [(nic, name, guid)]
        by_key = {}
        for i, p in enumerate(procs):
            lst = []
            for nic in _header(p).get("nics", []) or []:
                if not isinstance(nic, dict):
                    continue
                guid = norm_guid(nic.get("node_guid") or nic.get("guid"))
                key = ("guid", guid) if guid else ("name", int(node_of[i]), str(nic.get("name")))
                if key in by_key:
                    nid = by_key[key]
                else:
                    nid = len(self.rows)
                    by_key[key] = nid
                    self.rows.append((nid, i, int(node_of[i]), str(nic.get("name", "")), guid or ""))
                lst.append((nid, str(nic.get("name", "")), guid))
                for port in nic.get("ports") or [nic]:
                    if not isinstance(port, dict):
                        continue
                    lid = port.get("lid")
                    if lid:
                        self.by_lid.setdefault(int(lid), nid)
                    for g in port.get("gids") or ([port["gid"]] if port.get("gid") else []):
                        ng = norm_gid(g)
                        if ng:
                            self.by_gid.setdefault(ng, nid)
            self.of_process[i] = lst

    def nic_for(self, proc_i, js):
        """The NIC a record of process ``proc_i`` names (side JSON: device / node GUID), else the process's
        first NIC, else one unknown NIC per node (negative ids)."""
        lst = self.of_process.get(proc_i) or []
        if isinstance(js, dict):
            want = js.get("device") or js.get("nic") or js.get("ibdev")
            guid = norm_guid(js.get("node_guid") or js.get("guid"))
            for nid, name, g in lst:
                if (guid and g == guid) or (want and name == want):
                    return nid
        if lst:
            return lst[0][0]
        return -1 - int(self.node_of[proc_i])

    def table(self):
        rows = self.rows
        return dict(nic=np.array([r[0] for r in rows], np.int64), process=np.array([r[1] for r in rows], np.int64),
                    node=np.array([r[2] for r in rows], np.int64), name=np.array([r[3] for r in rows], dtype=object),
                    node_guid=np.array([r[4] for r in rows], dtype=object))
