-- Per-QP volume, active time span and average bandwidth (GB/s = bytes per ns).
-- ``part``: the per-key sums over ops that the rest reads (analysis.summable.SPLIT: the cluster report runs it
-- on every part of the ops table and adds the parts up; its columns are BIGINT so both ways give one type).
WITH part AS (SELECT qp_id::BIGINT AS qp_id, sum(bytes)::BIGINT AS bytes, count(*)::BIGINT AS ops,
                     min(ns)::BIGINT AS first_ns, max(ns)::BIGINT AS last_ns FROM ops GROUP BY qp_id)
SELECT q.qp_id, q.qpn, q.rank, q.node, q.gpu, q.remote_rank, q.remote_node, q.remote_qpn,
       coalesce(o.bytes, 0) AS bytes, coalesce(o.ops, 0) AS ops, o.first_ns, o.last_ns,
       CASE WHEN o.last_ns > o.first_ns THEN o.bytes / (o.last_ns - o.first_ns) ELSE NULL END AS gbps
FROM qps q LEFT JOIN part o ON o.qp_id = q.qp_id
ORDER BY bytes DESC, q.qp_id;
