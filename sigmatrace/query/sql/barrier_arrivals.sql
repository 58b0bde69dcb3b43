-- Arrival order at each barrier: position 0 arrives first; wait_ns = time until the last arrival.
SELECT a.barrier, b.instance, a.position, a.label, a.rank, a.gpu, a.node, a.ns, a.wait_ns
FROM barrier_arrivals a JOIN barriers b USING (barrier) ORDER BY a.barrier, a.position;
