-- Traffic skew across GPUs (pairs of distinct GPUs): egress and ingress imbalance (max/min), the heaviest GPU pair
-- vs the mean pair over every ordered pair of distinct GPUs (idle pairs included) and vs the mean active pair,
-- with the number of active pairs and of destinations per sending GPU (min / max); see skew_node.
-- ``part``: the bytes per pair, the only thing read from ops (analysis.summable.SPLIT).
WITH part AS (SELECT gpu::BIGINT AS src, dst_gpu::BIGINT AS dst, sum(bytes)::BIGINT AS bytes FROM ops
              WHERE gpu >= 0 AND dst_gpu >= 0 AND dst_gpu <> gpu GROUP BY ALL),
     m AS (SELECT * FROM part),
     e AS (SELECT src, sum(bytes) AS b, count(*) AS fanout, max(bytes) AS top FROM m GROUP BY src),
     i AS (SELECT dst, sum(bytes) AS b FROM m GROUP BY dst)
SELECT (SELECT max(b) / nullif(min(b), 0) FROM e) AS egress_imbalance,
       (SELECT max(b) / nullif(min(b), 0) FROM i) AS ingress_imbalance,
       (SELECT max(bytes) / nullif(sum(bytes) / ((SELECT count(*) FROM gpus) * ((SELECT count(*) FROM gpus) - 1)), 0) FROM m)
         AS heaviest_pair_vs_mean,  -- mean over every ordered pair of distinct GPUs
       (SELECT max(bytes) / nullif(avg(bytes), 0) FROM m) AS heaviest_pair_vs_active_mean,
       (SELECT max(top) / nullif(avg(top), 0) FROM e) AS heaviest_pair_vs_top_pairs,  -- vs each sender's heaviest pair
       (SELECT count(*) FROM m) AS active_pairs,
       (SELECT count(*) * (count(*) - 1) FROM gpus) AS pairs,
       (SELECT count(*) FROM e) AS senders,
       (SELECT min(fanout) FROM e) AS min_destinations, (SELECT max(fanout) FROM e) AS max_destinations,
       (SELECT src FROM m ORDER BY bytes DESC, src, dst LIMIT 1) AS heaviest_src,
       (SELECT dst FROM m ORDER BY bytes DESC, src, dst LIMIT 1) AS heaviest_dst,  -- one pair; ties: lowest ids
       (SELECT max(bytes) FROM m) AS heaviest_bytes, (SELECT src FROM e ORDER BY b DESC, src LIMIT 1) AS heaviest_egress_gpu,
       (SELECT dst FROM i ORDER BY b DESC, dst LIMIT 1) AS heaviest_ingress_gpu;
