-- Egress bandwidth over time per GPU: bytes of the operations posted in each bin (width from the variable
-- bin_ns, default 1 ms) and gbps = bytes / bin_ns (bytes per ns = GB/s).  Every bin from the first to the last
-- operation is a row for every GPU that sent anything, 0 where it was idle (averages over bins and step
-- plots are not fooled by gaps).
WITH w AS (SELECT coalesce(getvariable('bin_ns'), 1000000)::BIGINT AS w),
s AS (SELECT o.gpu, o.ns // w.w AS k, sum(o.bytes) AS bytes FROM ops o, w WHERE o.gpu >= 0 GROUP BY ALL),
grid AS (SELECT g.gpu, unnest(range((SELECT min(k) FROM s), (SELECT max(k) FROM s) + 1)) AS k
         FROM (SELECT DISTINCT gpu FROM s) g)
SELECT grid.gpu, t.label, grid.k * w.w AS t_ns, coalesce(s.bytes, 0) AS bytes, coalesce(s.bytes, 0) / w.w AS gbps
FROM grid JOIN gpus t ON t.gpu = grid.gpu CROSS JOIN w LEFT JOIN s ON s.gpu = grid.gpu AND s.k = grid.k
ORDER BY grid.gpu, t_ns;
