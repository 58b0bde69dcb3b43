-- Latency samples per operation kind (opcode_name) and source (docs/report.md, "Latency figure"):
--  measure 'completion': post -> the operation's own completion (ops.latency_ns, where it was recorded);
--  measure 'interval':   time since the previous post on the same QP (UCX / libfabric: the same host thread) for
--                        operations without a recorded completion; operations posted at the same time (one
--                        doorbell, one post call) are one post, its kind their opcodes joined by '+' when they differ.  In a
--                        blocking loop (post, wait, repeat) that is the iteration time; in a pipelined stream
--                        it is the gap between posts, not a latency.  QPs whose doorbells carry no recovered
--                        operation (forward-only tracing) give doorbell -> doorbell intervals (kind 'doorbell').
WITH posts AS (
  SELECT qp_id, CASE WHEN qp_id < 0 THEN process END AS p, CASE WHEN qp_id < 0 THEN thread END AS th, ns,
         string_agg(DISTINCT opcode_name, '+' ORDER BY opcode_name) AS kind,
         min(source_name) AS source
  FROM ops WHERE latency_ns IS NULL GROUP BY qp_id, p, th, ns),
gaps AS (
  SELECT kind, source, ns - lag(ns) OVER (PARTITION BY qp_id, p, th ORDER BY ns) AS gap_ns FROM posts),
db AS (
  SELECT 'doorbell' AS kind, 'doorbell' AS source, ns - lag(ns) OVER (PARTITION BY qp_id ORDER BY ns, doorbell_id) AS gap_ns
  FROM doorbells WHERE qp_id >= 0 AND qp_id NOT IN (SELECT DISTINCT qp_id FROM ops WHERE qp_id >= 0))
SELECT opcode_name AS kind, source_name AS source, 'completion' AS measure, latency_ns AS value_ns
FROM ops WHERE latency_ns IS NOT NULL
UNION ALL
SELECT kind, source, 'interval', gap_ns FROM gaps WHERE gap_ns IS NOT NULL
UNION ALL
SELECT kind, source, 'interval', gap_ns FROM db WHERE gap_ns IS NOT NULL;
