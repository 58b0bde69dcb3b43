-- GPU-level communication matrix (GPU-initiated and GPU-attributed traffic); aggregate-mode operation
-- counters on QPs with a known GPU are folded in.
SELECT gs.label AS src, gd.label AS dst, x.src_gpu, x.dst_gpu, sum(x.bytes) AS bytes, sum(x.n) AS ops
FROM (
  SELECT o.gpu AS src_gpu, o.dst_gpu, o.bytes, 1 AS n FROM ops o
  UNION ALL
  SELECT a.gpu, a.dst_gpu, a.bytes, a.count FROM aggregates a WHERE a.is_op
) x JOIN gpus gs ON gs.gpu = x.src_gpu JOIN gpus gd ON gd.gpu = x.dst_gpu
GROUP BY ALL ORDER BY src_gpu, dst_gpu;
