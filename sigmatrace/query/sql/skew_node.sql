-- Traffic skew across nodes (inter-node pairs only): egress and ingress imbalance (max/min over the nodes that
-- send / receive), the heaviest pair vs the mean pair over every ordered pair of distinct nodes (idle pairs
-- included: a sparse but even pattern such as a ring, where each node sends to its next only, scores N-1 here),
-- vs the mean *active* pair (pairs that carry traffic: 1.0 for that ring, but 2.0 for a ring whose data goes
-- forward and small acknowledgements back) and vs the mean of every sending node's heaviest pair (1.0 for any
-- ring: "is one pair hotter than the other nodes' main pairs"), with how many pairs are active and how many
-- destinations each sending node has (min / max).
-- ``part``: the bytes per pair, the only thing read from ops (analysis.summable.SPLIT).
WITH part AS (SELECT node::BIGINT AS src, dst_node::BIGINT AS dst, sum(bytes)::BIGINT AS bytes FROM ops
              WHERE dst_node >= 0 AND dst_node <> node GROUP BY ALL),
     m AS (SELECT * FROM part),
     e AS (SELECT src, sum(bytes) AS b, count(*) AS fanout, max(bytes) AS top FROM m GROUP BY src),
     i AS (SELECT dst, sum(bytes) AS b FROM m GROUP BY dst)
SELECT (SELECT max(b) / nullif(min(b), 0) FROM e) AS egress_imbalance,
       (SELECT max(b) / nullif(min(b), 0) FROM i) AS ingress_imbalance,
       (SELECT max(bytes) / nullif(sum(bytes) / ((SELECT count(*) FROM nodes) * ((SELECT count(*) FROM nodes) - 1)), 0) FROM m)
         AS heaviest_pair_vs_mean,  -- mean over every ordered pair of distinct nodes, idle pairs included
       (SELECT max(bytes) / nullif(avg(bytes), 0) FROM m) AS heaviest_pair_vs_active_mean,
       (SELECT max(top) / nullif(avg(top), 0) FROM e) AS heaviest_pair_vs_top_pairs,  -- vs each sender's heaviest pair
       (SELECT count(*) FROM m) AS active_pairs,
       (SELECT count(*) * (count(*) - 1) FROM nodes) AS pairs,
       (SELECT count(*) FROM e) AS senders,
       (SELECT min(fanout) FROM e) AS min_destinations, (SELECT max(fanout) FROM e) AS max_destinations,
       (SELECT src FROM m ORDER BY bytes DESC, src, dst LIMIT 1) AS heaviest_src,
       (SELECT dst FROM m ORDER BY bytes DESC, src, dst LIMIT 1) AS heaviest_dst,  -- one pair; ties: lowest ids
       (SELECT max(bytes) FROM m) AS heaviest_bytes, (SELECT src FROM e ORDER BY b DESC, src LIMIT 1) AS heaviest_egress_node,
       (SELECT dst FROM i ORDER BY b DESC, dst LIMIT 1) AS heaviest_ingress_node;
