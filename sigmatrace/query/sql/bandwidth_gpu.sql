-- Egress bandwidth over time per GPU; bin width from the variable bin_ns (default 1 ms).
SELECT o.gpu, g.label, (o.ns // coalesce(getvariable('bin_ns'), 1000000)) * coalesce(getvariable('bin_ns'), 1000000) AS t_ns,
       sum(o.bytes) AS bytes, sum(o.bytes) / coalesce(getvariable('bin_ns'), 1000000) AS gbps
FROM ops o JOIN gpus g ON g.gpu = o.gpu GROUP BY ALL ORDER BY o.gpu, t_ns;
