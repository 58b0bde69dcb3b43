-- Heaviest source -> destination rank pairs.
SELECT o.rank AS src_rank, o.dst_rank, s.label AS src_node, d.label AS dst_node, sum(o.bytes) AS bytes, count(*) AS ops
FROM ops o JOIN nodes s ON s.node = o.node LEFT JOIN nodes d ON d.node = o.dst_node
GROUP BY ALL ORDER BY bytes DESC, src_rank, dst_rank, src_node, dst_node LIMIT 10;
