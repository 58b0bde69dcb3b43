-- Bandwidth over time per QP; bin width from the variable bin_ns (default 1 ms).
SELECT o.qp_id, o.qpn, o.rank, (o.ns // coalesce(getvariable('bin_ns'), 1000000)) * coalesce(getvariable('bin_ns'), 1000000) AS t_ns,
       sum(o.bytes) AS bytes, sum(o.bytes) / coalesce(getvariable('bin_ns'), 1000000) AS gbps
FROM ops o GROUP BY ALL ORDER BY o.qp_id, t_ns;
