-- Heaviest rank pairs, each pair once (a <-> b with a < b; both directions' bytes and ops); a peer that is not in
-- the capture (dst_rank -1: its QP or endpoint was not traced or not resolved) is one row per source rank.
WITH d AS (SELECT o.rank AS src, o.dst_rank AS dst, sum(o.bytes) AS bytes, count(*) AS ops FROM ops o GROUP BY ALL),
     p AS (SELECT CASE WHEN dst < 0 OR src < dst THEN src ELSE dst END AS rank_a,
                  CASE WHEN dst < 0 OR src < dst THEN dst ELSE src END AS rank_b,
                  CASE WHEN dst < 0 OR src < dst THEN bytes ELSE 0 END AS ab_bytes,
                  CASE WHEN dst < 0 OR src < dst THEN 0 ELSE bytes END AS ba_bytes, ops
           FROM d WHERE src <> dst OR dst < 0)
SELECT p.rank_a, p.rank_b, na.label AS node_a, nb.label AS node_b, sum(p.ab_bytes + p.ba_bytes) AS bytes,
       sum(p.ab_bytes) AS a_to_b_bytes, sum(p.ba_bytes) AS b_to_a_bytes, sum(p.ops) AS ops
FROM p LEFT JOIN (SELECT DISTINCT rank, node_label AS label FROM processes WHERE rank >= 0) na ON na.rank = p.rank_a
       LEFT JOIN (SELECT DISTINCT rank, node_label AS label FROM processes WHERE rank >= 0) nb ON nb.rank = p.rank_b
GROUP BY ALL ORDER BY bytes DESC, rank_a, rank_b LIMIT 10;
