-- Heaviest pairs of processes, each pair once (process_a <-> process_b with process_a < process_b; both directions'
-- bytes and ops), with their ranks (-1 when the process has none, e.g. a plain libfabric program), pids and
-- nodes; a peer that is not in the capture (dst_process -1: its QP or endpoint was not traced or not resolved)
-- is one row per source process with process_b = -1.
-- ``part``: bytes and operations per (process, peer process), the only thing read from ops
-- (analysis.summable.SPLIT).
WITH part AS (SELECT o.process::BIGINT AS src, o.dst_process::BIGINT AS dst, sum(o.bytes)::BIGINT AS bytes,
                     count(*)::BIGINT AS ops FROM ops o GROUP BY ALL),
     d AS (SELECT * FROM part),
     p AS (SELECT CASE WHEN dst < 0 OR src < dst THEN src ELSE dst END AS process_a,
                  CASE WHEN dst < 0 OR src < dst THEN dst ELSE src END AS process_b,
                  CASE WHEN dst < 0 OR src < dst THEN bytes ELSE 0 END AS ab_bytes,
                  CASE WHEN dst < 0 OR src < dst THEN 0 ELSE bytes END AS ba_bytes, ops
           FROM d WHERE src <> dst OR dst < 0)
SELECT p.process_a, p.process_b, coalesce(pa.rank, -1) AS rank_a, coalesce(pb.rank, -1) AS rank_b,
       pa.pid AS pid_a, pb.pid AS pid_b, pa.node_label AS node_a, pb.node_label AS node_b,
       sum(p.ab_bytes + p.ba_bytes) AS bytes, sum(p.ab_bytes) AS a_to_b_bytes, sum(p.ba_bytes) AS b_to_a_bytes,
       sum(p.ops) AS ops
FROM p LEFT JOIN processes pa ON pa.process = p.process_a LEFT JOIN processes pb ON pb.process = p.process_b
GROUP BY ALL ORDER BY bytes DESC, process_a, process_b LIMIT 10;
