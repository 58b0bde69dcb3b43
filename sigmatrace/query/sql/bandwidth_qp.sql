-- Bandwidth over time per QP: bytes of the operations posted in each bin (width from the variable bin_ns,
-- default 1 ms) and gbps = bytes / bin_ns (bytes per ns = GB/s); every bin from the first to the last
-- operation is a row for every QP that sent anything, 0 where it was idle.
WITH w AS (SELECT coalesce(getvariable('bin_ns'), 1000000)::BIGINT AS w),
s AS (SELECT o.qp_id, o.ns // w.w AS k, sum(o.bytes) AS bytes FROM ops o, w WHERE o.qp_id >= 0 GROUP BY ALL),
grid AS (SELECT g.qp_id, unnest(range((SELECT min(k) FROM s), (SELECT max(k) FROM s) + 1)) AS k
         FROM (SELECT DISTINCT qp_id FROM s) g)
SELECT grid.qp_id, q.qpn, q.rank, grid.k * w.w AS t_ns, coalesce(s.bytes, 0) AS bytes, coalesce(s.bytes, 0) / w.w AS gbps
FROM grid JOIN qps q ON q.qp_id = grid.qp_id CROSS JOIN w LEFT JOIN s ON s.qp_id = grid.qp_id AND s.k = grid.k
ORDER BY grid.qp_id, t_ns;
