-- Per-GPU egress and ingress volume.
WITH e AS (SELECT gpu, sum(bytes) AS egress, count(*) AS ops_out FROM ops WHERE gpu >= 0 GROUP BY gpu),
     i AS (SELECT dst_gpu AS gpu, sum(bytes) AS ingress, count(*) AS ops_in FROM ops WHERE dst_gpu >= 0 GROUP BY dst_gpu)
SELECT g.gpu, g.label, g.node, g.rank, coalesce(e.egress, 0) AS egress_bytes, coalesce(i.ingress, 0) AS ingress_bytes,
       coalesce(e.ops_out, 0) AS ops_out, coalesce(i.ops_in, 0) AS ops_in
FROM gpus g LEFT JOIN e USING (gpu) LEFT JOIN i USING (gpu) ORDER BY g.gpu;
