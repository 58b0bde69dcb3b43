-- Node-level communication matrix: bytes and operations issued from src_node to dst_node
-- (initiator -> target; for RDMA_READ the data flows the other way, see is_read); aggregate-mode
-- operation counters (aggregates.is_op, with a known peer) are folded in.
SELECT s.label AS src, d.label AS dst, x.src_node, x.dst_node, sum(x.bytes) AS bytes, sum(x.n) AS ops
FROM (
  SELECT o.node AS src_node, o.dst_node, o.bytes, 1 AS n FROM ops o WHERE o.dst_node >= 0
  UNION ALL
  SELECT a.node, a.dst_node, a.bytes, a.count FROM aggregates a WHERE a.is_op AND a.dst_node >= 0
) x JOIN nodes s ON s.node = x.src_node JOIN nodes d ON d.node = x.dst_node
GROUP BY ALL ORDER BY src_node, dst_node;
