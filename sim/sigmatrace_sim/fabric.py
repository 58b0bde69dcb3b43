"""Fabric: NIC ports, links and one switch, with latency, bandwidth and contention.

Each NIC port has a transmit and a receive side.  A message of n bytes leaves
when the sender's transmit side is free, serialises at link bandwidth, crosses
link + switch + link, and is received when the receiver's receive side is free
(cut-through; two senders into one receiver queue behind each other).  The ports
are busy-until timelines (max-plus recurrences) rather than SimPy resources: a
message needs no event of its own, only the callbacks that someone waits on.
`Fabric.send` is the definition, called by the NIC's per-WQE loop (nic.Nic.doorbell); the closed-form
post + quiet chains (closed_form.py) apply the same recurrence inline.
"""


class Port:
    __slots__ = ("name", "tx_free", "rx_free", "tx_bytes", "rx_bytes")

    def __init__(self, name):
        self.name = name
        self.tx_free = 0.0
        self.rx_free = 0.0
        self.tx_bytes = 0
        self.rx_bytes = 0


class Fabric:
    def __init__(self, timing):
        self.t = timing
        self.ports = {}

    def port(self, name):
        p = self.ports.get(name)
        if p is None:
            p = self.ports[name] = Port(name)
        return p

    def send(self, src: Port, dst: Port, nbytes, t_ready):
        """Time the last byte of an n-byte message is in dst's receive buffer."""
        tm = self.t
        wire = nbytes + tm.header_bytes
        ser = wire / tm.link_bw
        start = max(t_ready, src.tx_free)
        src.tx_free = start + ser
        src.tx_bytes += wire
        if src is dst:
            hop = tm.loopback_ns
        else:
            hop = 2 * tm.link_latency_ns + tm.switch_latency_ns
        end = max(start + hop + ser, dst.rx_free + ser)
        dst.rx_free = end
        dst.rx_bytes += wire
        return end
