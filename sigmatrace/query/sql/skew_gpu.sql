-- Traffic skew across GPUs: egress and ingress imbalance (max/min) and the heaviest GPU pair vs the mean pair.
WITH m AS (SELECT gpu AS src, dst_gpu AS dst, sum(bytes) AS bytes FROM ops WHERE gpu >= 0 AND dst_gpu >= 0 AND dst_gpu <> gpu GROUP BY ALL),
     e AS (SELECT src, sum(bytes) AS b FROM m GROUP BY src),
     i AS (SELECT dst, sum(bytes) AS b FROM m GROUP BY dst)
SELECT (SELECT max(b) / nullif(min(b), 0) FROM e) AS egress_imbalance,
       (SELECT max(b) / nullif(min(b), 0) FROM i) AS ingress_imbalance,
       (SELECT max(bytes) / nullif(sum(bytes) / ((SELECT count(*) FROM gpus) * ((SELECT count(*) FROM gpus) - 1)), 0) FROM m)
         AS heaviest_pair_vs_mean,  -- mean over every ordered pair of distinct GPUs
       (SELECT src FROM m ORDER BY bytes DESC, src, dst LIMIT 1) AS heaviest_src,
       (SELECT dst FROM m ORDER BY bytes DESC, src, dst LIMIT 1) AS heaviest_dst,  -- one pair; ties: lowest ids
       (SELECT max(bytes) FROM m) AS heaviest_bytes;
