-- GPU-level communication matrix (GPU-initiated and GPU-attributed traffic).
SELECT gs.label AS src, gd.label AS dst, o.gpu AS src_gpu, o.dst_gpu, sum(o.bytes) AS bytes, count(*) AS ops
FROM ops o JOIN gpus gs ON gs.gpu = o.gpu JOIN gpus gd ON gd.gpu = o.dst_gpu
GROUP BY ALL ORDER BY src_gpu, dst_gpu;
