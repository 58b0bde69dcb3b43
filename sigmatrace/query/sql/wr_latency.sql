-- Post-to-completion latency per QP (F24a), for work requests whose completion was recorded
-- (latency_ns is NULL otherwise, so the aggregates count measured values only).
SELECT qp_id, qpn, rank, opcode_name, count(latency_ns) AS completed, avg(latency_ns) AS mean_ns,
       quantile_cont(latency_ns, 0.5) AS p50_ns, quantile_cont(latency_ns, 0.99) AS p99_ns, max(latency_ns) AS max_ns
FROM ops WHERE latency_ns IS NOT NULL GROUP BY ALL ORDER BY p99_ns DESC, qp_id, opcode_name;
