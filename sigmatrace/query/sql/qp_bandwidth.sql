-- Per-QP volume, active time span and average bandwidth (GB/s = bytes per ns).
SELECT q.qp_id, q.qpn, q.rank, q.node, q.gpu, q.remote_rank, q.remote_node, q.remote_qpn,
       coalesce(sum(o.bytes), 0) AS bytes, count(o.op_id) AS ops,
       min(o.ns) AS first_ns, max(o.ns) AS last_ns,
       CASE WHEN max(o.ns) > min(o.ns) THEN sum(o.bytes) / (max(o.ns) - min(o.ns)) ELSE NULL END AS gbps
FROM qps q LEFT JOIN ops o ON o.qp_id = q.qp_id
GROUP BY ALL ORDER BY bytes DESC, q.qp_id;
