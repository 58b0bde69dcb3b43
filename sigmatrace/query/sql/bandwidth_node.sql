-- Egress bandwidth over time per node; bin width from the variable bin_ns (default 1 ms).
SELECT o.node, n.label, (o.ns // coalesce(getvariable('bin_ns'), 1000000)) * coalesce(getvariable('bin_ns'), 1000000) AS t_ns,
       sum(o.bytes) AS bytes, sum(o.bytes) / coalesce(getvariable('bin_ns'), 1000000) AS gbps
FROM ops o JOIN nodes n ON n.node = o.node GROUP BY ALL ORDER BY o.node, t_ns;
