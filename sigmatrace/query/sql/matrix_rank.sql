-- Rank-level communication matrix (initiator rank -> target rank).
SELECT o.rank AS src_rank, o.dst_rank, sum(o.bytes) AS bytes, count(*) AS ops
FROM ops o WHERE o.dst_rank >= 0 AND o.rank >= 0
GROUP BY ALL ORDER BY src_rank, dst_rank;
