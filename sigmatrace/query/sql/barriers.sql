-- Barrier instances (recognised as equal-count fetch-add atomics to a shared counter, see docs/report.md):
-- first/last arrival, spread and the straggler, worst first.
SELECT barrier, series, instance, participants, first_ns, last_ns, spread_ns,
       straggler_label, straggler_rank, straggler_gpu, arrival_order
FROM barriers ORDER BY spread_ns DESC, barrier;
