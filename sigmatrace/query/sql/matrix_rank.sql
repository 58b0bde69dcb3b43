-- Rank-level communication matrix (initiator rank -> target rank); aggregate-mode operation counters
-- (aggregates.is_op, with a known peer) are folded in.
SELECT src_rank, dst_rank, sum(bytes) AS bytes, sum(n) AS ops FROM (
  SELECT o.rank AS src_rank, o.dst_rank, o.bytes, 1 AS n FROM ops o WHERE o.dst_rank >= 0 AND o.rank >= 0
  UNION ALL
  SELECT a.rank, a.dst_rank, a.bytes, a.count FROM aggregates a WHERE a.is_op AND a.dst_rank >= 0 AND a.rank >= 0
)
GROUP BY ALL ORDER BY src_rank, dst_rank;
