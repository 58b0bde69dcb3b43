-- Heaviest source -> destination rank pairs.
-- ``part``: bytes and operations per (rank, node) pair, the only thing read from ops (analysis.summable.SPLIT).
WITH part AS (SELECT rank::BIGINT AS rank, dst_rank::BIGINT AS dst_rank, node::BIGINT AS node,
                     dst_node::BIGINT AS dst_node, sum(bytes)::BIGINT AS bytes, count(*)::BIGINT AS ops
              FROM ops GROUP BY ALL)
SELECT o.rank AS src_rank, o.dst_rank, s.label AS src_node, d.label AS dst_node, sum(o.bytes) AS bytes, sum(o.ops) AS ops
FROM part o JOIN nodes s ON s.node = o.node LEFT JOIN nodes d ON d.node = o.dst_node
GROUP BY ALL ORDER BY bytes DESC, src_rank, dst_rank, src_node, dst_node LIMIT 10;
