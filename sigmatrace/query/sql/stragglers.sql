-- Who is last most often, and how much time the others wait for it.
SELECT straggler_label, straggler_rank, count(*) AS times_last, sum(spread_ns) AS total_spread_ns,
       max(spread_ns) AS worst_spread_ns
FROM barriers GROUP BY ALL ORDER BY times_last DESC, total_spread_ns DESC, straggler_label;
