-- Traffic skew across nodes: egress and ingress imbalance (max/min) and the heaviest pair vs the mean pair.
WITH m AS (SELECT node AS src, dst_node AS dst, sum(bytes) AS bytes FROM ops WHERE dst_node >= 0 AND dst_node <> node GROUP BY ALL),
     e AS (SELECT src, sum(bytes) AS b FROM m GROUP BY src),
     i AS (SELECT dst, sum(bytes) AS b FROM m GROUP BY dst)
SELECT (SELECT max(b) / nullif(min(b), 0) FROM e) AS egress_imbalance,
       (SELECT max(b) / nullif(min(b), 0) FROM i) AS ingress_imbalance,
       (SELECT max(bytes) / nullif(sum(bytes) / ((SELECT count(*) FROM nodes) * ((SELECT count(*) FROM nodes) - 1)), 0) FROM m)
         AS heaviest_pair_vs_mean,  -- mean over every ordered pair of distinct nodes, idle pairs included
       (SELECT src FROM m ORDER BY bytes DESC, src, dst LIMIT 1) AS heaviest_src,
       (SELECT dst FROM m ORDER BY bytes DESC, src, dst LIMIT 1) AS heaviest_dst,  -- one pair; ties: lowest ids
       (SELECT max(bytes) FROM m) AS heaviest_bytes, (SELECT src FROM e ORDER BY b DESC, src LIMIT 1) AS heaviest_egress_node,
       (SELECT dst FROM i ORDER BY b DESC, dst LIMIT 1) AS heaviest_ingress_node;
