-- Node-level communication matrix: bytes and operations issued from src_node to dst_node
-- (initiator -> target; for RDMA_READ the data flows the other way, see is_read).
SELECT s.label AS src, d.label AS dst, o.node AS src_node, o.dst_node, sum(o.bytes) AS bytes, count(*) AS ops
FROM ops o JOIN nodes s ON s.node = o.node JOIN nodes d ON d.node = o.dst_node
WHERE o.dst_node >= 0
GROUP BY ALL ORDER BY src_node, dst_node;
