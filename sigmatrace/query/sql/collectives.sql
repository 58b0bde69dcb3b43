-- NCCL collectives per kind and size (docs/report.md "Collectives"): executed calls, their cross-rank
-- instances, the calls attributed alone (attribution = 'window': their own unit of work requests), the work
-- requests and bytes on the wire per such call, the time from the call to its end (the last completion of
-- its work requests in full mode, else its last work request) and the rank most often slowest (the rank
-- whose end is last in an instance).  Calls that share a unit (NCCL groups, calls in flight together) are
-- counted in `shared`; their bytes are in the unit (`collectives.unit`, ops.collective_unit).
WITH c AS (SELECT * FROM collectives WHERE seq >= 0),
slow AS (
  SELECT op, bytes, slowest_rank, count(DISTINCT instance) AS n
  FROM c WHERE instance >= 0 AND slowest_rank >= 0 GROUP BY op, bytes, slowest_rank),
top AS (
  SELECT op, bytes, slowest_rank, n, row_number() OVER (PARTITION BY op, bytes ORDER BY n DESC, slowest_rank) AS k
  FROM slow)
SELECT c.op, c.bytes, count(*) AS calls, count(DISTINCT c.instance) FILTER (WHERE c.instance >= 0) AS instances,
       count(DISTINCT c.rank) AS ranks,
       count(*) FILTER (WHERE c.attribution = 'window') AS attributed,
       count(*) FILTER (WHERE c.attribution IN ('group', 'in-flight')) AS shared,
       coalesce(sum(c.wrs) FILTER (WHERE c.attribution = 'window'), 0) AS wrs,
       coalesce(sum(c.wire_bytes) FILTER (WHERE c.attribution = 'window'), 0) AS wire_bytes,
       avg(c.wire_bytes) FILTER (WHERE c.attribution = 'window') AS wire_bytes_per_call,
       quantile_cont(c.duration_ns, 0.5) FILTER (WHERE c.attribution = 'window') AS p50_ns,
       avg(c.duration_ns) FILTER (WHERE c.attribution = 'window') AS mean_ns,
       max(c.duration_ns) FILTER (WHERE c.attribution = 'window') AS max_ns,
       any_value(t.slowest_rank) AS slowest_rank, any_value(t.n) AS slowest_times
FROM c LEFT JOIN top t ON t.op = c.op AND t.bytes = c.bytes AND t.k = 1
GROUP BY c.op, c.bytes
ORDER BY c.op, c.bytes;
