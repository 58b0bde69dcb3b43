-- QP-level matrix: every connected QP pair with the traffic it carried.
SELECT o.qp_id, o.qpn, o.rank, o.node, o.dst_qp_id, o.dst_qpn, o.dst_rank, o.dst_node,
       sum(o.bytes) AS bytes, count(*) AS ops
FROM ops o WHERE o.dst_qp_id >= 0
GROUP BY ALL ORDER BY bytes DESC, qp_id, dst_qp_id;
