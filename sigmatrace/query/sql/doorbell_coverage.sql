-- Doorbell <-> WQE association per QP: doorbells, coalesced ones, fully recovered ones.
SELECT qp_id, qpn, process, count(*) AS doorbells, sum(CASE WHEN wqes > 1 THEN 1 ELSE 0 END) AS coalesced,
       sum(CASE WHEN complete THEN 1 ELSE 0 END) AS recovered, sum(wqes) AS wqes, sum(lost_wqebbs) AS lost_wqebbs
FROM doorbells GROUP BY ALL ORDER BY qp_id;
