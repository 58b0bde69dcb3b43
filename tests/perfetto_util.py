"""Read a Perfetto trace the way trace_processor does: deflate bundles (TracePacket.compressed_packets) expanded in
place, each at most 512 KiB; then, with its interned data: per packet sequence, the state is
cleared by SEQ_INCREMENTAL_STATE_CLEARED and filled by each packet's interned_data; a packet that refers to an
iid must say SEQ_NEEDS_INCREMENTAL_STATE and find the iid defined earlier on its sequence.  ``read_trace``
returns the Trace with every iid replaced by its string (TrackEvent.name, category names in ``categories``,
DebugAnnotation.name and .string_value), so that checks compare events and annotations as written."""
import zlib

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as P

TABLES = ("event_names", "event_categories", "debug_annotation_names", "debug_annotation_string_values")


def read_trace(path_or_bytes, categories=None):
    """The parsed Trace with interned names resolved (asserts the interning is well-formed); ``categories``: a
    dict filled with {index of the packet in the returned trace: [category names]}."""
    data = path_or_bytes if isinstance(path_or_bytes, (bytes, bytearray)) else open(path_or_bytes, "rb").read()
    outer = P.Trace()
    outer.ParseFromString(data)
    tr = P.Trace()
    for p in outer.packet:
        if p.HasField("compressed_packets"):
            assert p.ByteSize() < 512 * 1024 and p.ListFields()[0][0].name == "compressed_packets" \
                and len(p.ListFields()) == 1, "a bundle is one compressed_packets field below 512 KiB"
            inner = P.Trace()
            inner.ParseFromString(zlib.decompress(p.compressed_packets))
            assert not any(q.HasField("compressed_packets") for q in inner.packet)
            tr.packet.extend(inner.packet)
        else:
            tr.packet.append(p)
    state = {}
    for i, p in enumerate(tr.packet):
        seq = p.trusted_packet_sequence_id
        if p.sequence_flags & P.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
            state[seq] = {t: {} for t in TABLES}
        if p.HasField("interned_data"):
            assert seq in state, "interned data before the sequence's state was cleared"
            for t in TABLES:
                for e in getattr(p.interned_data, t):
                    assert e.iid not in state[seq][t], (t, e.iid, "interned twice")
                    state[seq][t][e.iid] = e.str.decode() if t == "debug_annotation_string_values" else e.name
            p.ClearField("interned_data")
        if not p.HasField("track_event"):
            continue
        te = p.track_event
        uses = bool(te.name_iid or te.category_iids
                    or any(a.name_iid or a.string_value_iid for a in te.debug_annotations))
        if not uses:
            continue
        assert p.sequence_flags & P.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE, "iids without SEQ_NEEDS_INCREMENTAL_STATE"
        st = state[seq]
        if te.name_iid:
            te.name = st["event_names"][te.name_iid]
        if categories is not None:
            categories[i] = [st["event_categories"][c] for c in te.category_iids]
        for a in te.debug_annotations:
            if a.name_iid:
                a.name = st["debug_annotation_names"][a.name_iid]
            if a.string_value_iid:
                a.string_value = st["debug_annotation_string_values"][a.string_value_iid]
    return tr
