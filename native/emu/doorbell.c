/* The emulated NIC's doorbells (ref §3): UAR pages are ordinary memory, so
 * the NIC samples their doorbell registers instead of trapping the stores.
 *
 * What a sample tells the NIC, and what it checks:
 *  - the 8 bytes at 0x800 + 0x100 * r are a doorbell (the first 8 bytes of
 *    the last WQE's control segment): QPN, WQE index, DS, hence the new
 *    producer index (ref §3.3);
 *  - a producer index behind the one the same QP rang before on the same
 *    register is an error (db_stale_pi), and so is one more than the ring
 *    ahead of what the QP executed (db_pi_overrun): both are counted,
 *    logged under SIGMATRACE_EMU_DEBUG and otherwise ignored.  Registers
 *    are compared one by one because a sampler sees each register's writes
 *    in order but not the order between two registers: UCX alternates the
 *    two BlueFlame halves, and a doorbell on one half may be seen after a
 *    later one on the other (that one is covered, not an error);
 *  - on a QP with BlueFlame (init_obj reported bf.size 256) the bytes after
 *    the doorbell are the WQE copied there in 64-byte blocks (bf_post), or
 *    nothing new (db mode, or rdma-core's doorbell for a chain: an 8-byte
 *    store).  A copy is compared with the SQ's WQE; when it agrees it is what
 *    the NIC executes (bf_copies), when it differs the NIC flags it
 *    (bf_mismatch, after giving a copy still being written time to
 *    complete) and executes the copy, as hardware given a BlueFlame write
 *    would.  A register whose bytes past the doorbell are still those seen at
 *    its previous doorbell (or zeros, or the copy ibv_post_send wrote there
 *    last under SIGMATRACE_EMU_BF_POST) took an 8-byte doorbell: the WQE comes
 *    from the SQ (db_only).  A sampler cannot tell a copy whose first 16
 *    bytes have landed and nothing else yet from an 8-byte doorbell; either
 *    way the SQ's WQE, identical, is executed;
 *  - 0x20 of a context's CQ UAR page is a CQ arm doorbell (ref §2.2).
 * A UAR page shared by several QPs (SIGMATRACE_EMU_BFREG) loses doorbells
 * when two QPs ring one register between two samples: the other QPs then
 * catch up from their doorbell records (DBR+4 = BE32(pi & 0xffff), ref §3.1),
 * as a NIC's doorbell recovery would. */
#include <sched.h>
#include <string.h>

#include "emu_internal.h"

static int dbr_recovery(struct emu_nic *nic, struct emu_uar *u, struct emu_qp *rung)
{
	int work = 0;
	for (int i = 0; i < nic->nq; i++) {
		struct emu_qp *q = nic->qlist[i];
		if (q == rung || q->uar != u->page || !q->dbrec || q->state != IBV_QPS_RTS)
			continue;
		uint16_t pi = (uint16_t)(emu_dma_load_be32(&q->dbrec[ST_MLX5_SND_DBR]) & 0xffff);
		uint16_t ahead = (uint16_t)(pi - (uint16_t)q->sq_announced);
		if (ahead && ahead <= q->sq_wqebb && (uint16_t)(pi - (q->sq_exec & 0xffff)) <= q->sq_wqebb) {
			q->sq_announced = pi;
			work++;
		}
	}
	return work;
}

/* The NIC's view of a WQE in the SQ ring (wrap aware). */
EXPORT void emu_sq_bytes(const struct emu_qp *qp, uint32_t idx, uint8_t *dst, uint32_t len)
{
	uint32_t ring = qp->sq_wqebb * 64, pos = (idx & (qp->sq_wqebb - 1)) * 64;
	while (len) {
		uint32_t n = ring - pos < len ? ring - pos : len;
		memcpy(dst, qp->sq_buf + pos, n);
		dst += n;
		len -= n;
		pos = 0;
	}
}

static void reg_bytes(const volatile uint8_t *reg, uint8_t *dst, uint32_t len)
{
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	for (uint32_t i = 0; i < len; i += 8) {
		uint64_t v = __atomic_load_n((const uint64_t *)(reg + i), __ATOMIC_RELAXED);
		memcpy(dst + i, &v, 8);
	}
}

static int all_zero(const uint8_t *p, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		if (p[i])
			return 0;
	return 1;
}

static void bf_keep(struct emu_qp *qp, uint16_t idx, const uint8_t *b, uint32_t len)
{
	struct emu_bf_snap *slot = &qp->bf_snap[0];
	for (int i = 0; i < EMU_BF_SNAPS; i++) {
		struct emu_bf_snap *s = &qp->bf_snap[i];
		if (!s->valid || s->idx == idx) {
			slot = s;
			break;
		}
		/* else reuse the one furthest behind the execution point */
		if ((uint16_t)(s->idx - (uint16_t)qp->sq_exec) > (uint16_t)(slot->idx - (uint16_t)qp->sq_exec))
			slot = s;
	}
	slot->idx = idx;
	slot->len = (uint16_t)len;
	memcpy(slot->b, b, len);
	slot->valid = 1;
}

#define BF_SETTLE_NS 100000000ull /* how long a copy that differs may still be in flight */

/* A doorbell value v just sampled at register r of a BlueFlame QP's page:
 * compare the copy behind it with the SQ's WQE at db->wqe_index. */
static void bf_check(struct emu_nic *nic, struct emu_qp *qp, struct emu_uar *u, int r, uint64_t v,
		     const struct st_mlx5_db *db)
{
	const volatile uint8_t *reg = u->page + ST_MLX5_BF_OFFSET + 0x100 * r;
	uint8_t *seen = u->bf_seen[r];
	if (!db->ds)
		return; /* index = producer index (NVSHMEM style): no WQE behind it */
	uint32_t nbb = st_mlx5_wqebbs(db->ds);
	uint32_t len = (nbb < 4 ? nbb : 4) * 64;
	uint8_t sq[256], bf[256];
	emu_sq_bytes(qp, db->wqe_index, sq, len);
	uint64_t t0 = 0;
	for (;;) {
		reg_bytes(reg, bf, len);
		uint64_t now;
		memcpy(&now, bf, 8);
		if (now != v) { /* a later doorbell already: that one will be checked */
			nic->stats->bf_superseded++;
			return;
		}
		if (!memcmp(bf, sq, len)) {
			nic->stats->bf_copies++;
			bf_keep(qp, (uint16_t)db->wqe_index, bf, len);
			memcpy(seen, bf, len);
			return;
		}
		uint8_t posted[256];
		reg_bytes((const volatile uint8_t *)u->bf_written[r], posted, len);
		if (!memcmp(bf + 8, seen + 8, len - 8) || all_zero(bf + 8, len - 8) || !memcmp(bf + 8, posted + 8, len - 8)) {
			nic->stats->db_only++;
			memcpy(seen, bf, len);
			return;
		}
		/* differs: a copy still being written (64-byte blocks, 16 bytes at a
		 * time), or a wrong one; give a writer time, then flag it */
		if (!t0)
			t0 = emu_now_ns();
		else if (emu_now_ns() - t0 > BF_SETTLE_NS)
			break;
		sched_yield();
	}
	nic->stats->bf_mismatch++;
	uint32_t first = 0;
	while (first < len && bf[first] == sq[first])
		first++;
	EMU_ERR("BlueFlame ERROR: copy for qp 0x%x wqe %u differs from the SQ (first at byte %u of %u): executing the copy",
		qp->qpn, db->wqe_index, first, len);
	bf_keep(qp, (uint16_t)db->wqe_index, bf, len);
	memcpy(seen, bf, len);
}

/* One doorbell value for qp, sampled on register r of its page. */
static int qp_doorbell(struct emu_nic *nic, struct emu_qp *qp, struct emu_uar *u, int r, uint64_t v,
		       const struct st_mlx5_db *db)
{
	uint16_t pi = (uint16_t)db->next_pi;
	if (qp->db_seen & (1u << r)) {
		uint16_t d = (uint16_t)(pi - qp->db_last[r]);
		if (d & 0x8000) {
			nic->stats->db_stale_pi++;
			EMU_ERR("doorbell ERROR: qp 0x%x reg 0x%x producer index %u is behind %u, rung before on this register "
				"(ignored)", qp->qpn, ST_MLX5_BF_OFFSET + 0x100 * r, pi, qp->db_last[r]);
			return 0;
		}
		if (!d)
			return 0;
	}
	uint16_t exec = (uint16_t)qp->sq_exec;
	uint16_t ahead = (uint16_t)(pi - exec), behind = (uint16_t)(exec - pi);
	if (ahead > qp->sq_wqebb && behind > qp->sq_wqebb) {
		nic->stats->db_pi_overrun++;
		EMU_ERR("doorbell ERROR: qp 0x%x producer index %u is %u WQEBBs past the executed %u, more than the ring (%u) "
			"(ignored)", qp->qpn, pi, ahead, exec, qp->sq_wqebb);
		return 0;
	}
	qp->db_seen |= (uint8_t)(1u << r);
	qp->db_last[r] = pi;
	if (ahead > qp->sq_wqebb)
		return 0; /* behind what was executed: a late sample of a doorbell already covered */
	if (qp->bf_size || (nic->bf_post && !qp->devx)) /* init_obj's bf.size, or ibv_post_send's copies */
		bf_check(nic, qp, u, r, v, db);
	if (ahead > (uint16_t)(qp->sq_announced - qp->sq_exec))
		qp->sq_announced = qp->sq_exec + ahead;
	return 1;
}

/* A CQ arm doorbell (UAR + 0x20): BE64 of (sn << 28 | cmd | ci) << 32 | cqn. */
static void cq_arm_doorbell(struct emu_nic *nic, uint64_t raw)
{
	uint64_t v = be64toh(raw);
	uint32_t cqn = (uint32_t)v & 0xffffff, sn_cmd_ci = (uint32_t)(v >> 32);
	struct emu_cq *cq = emu_cq_lookup(nic, cqn);
	nic->stats->cq_arms++;
	EMU_LOG("CQ arm doorbell cqn 0x%x ci %u%s", cqn, sn_cmd_ci & 0xffffff,
		(sn_cmd_ci & ST_MLX5_CQ_DB_REQ_NOT_SOL) ? " (solicited)" : "");
	if (cq)
		emu_cq_arm(cq, !!(sn_cmd_ci & ST_MLX5_CQ_DB_REQ_NOT_SOL), sn_cmd_ci & 0xffffff);
}

int emu_scan_uars(struct emu_nic *nic)
{
	int work = 0;
	for (struct emu_uar *u = nic->uars; u; u = u->next) {
		if (u->cq_page) {
			uint64_t v = __atomic_load_n((uint64_t *)(u->page + ST_MLX5_CQ_DOORBELL), __ATOMIC_ACQUIRE);
			if (v != u->last_arm) {
				u->last_arm = v;
				cq_arm_doorbell(nic, v);
				work++;
			}
			continue;
		}
		int nreg = u->devx || nic->bf_post ? 4 : 1; /* BF_POST: ibv_post_send flips the halves */
		for (int r = 0; r < nreg; r++) {
			uint64_t v = __atomic_load_n((uint64_t *)(u->page + ST_MLX5_BF_OFFSET + 0x100 * r), __ATOMIC_ACQUIRE);
			if (v == u->last[r])
				continue;
			u->last[r] = v;
			uint8_t b[8];
			memcpy(b, &v, 8);
			struct st_mlx5_db db = st_mlx5_decode_db(b);
			struct emu_qp *qp = emu_qp_lookup(nic, db.qpn);
			nic->stats->doorbells++;
			EMU_LOG("doorbell uar %u reg %d: qpn 0x%x idx %u ds %u -> pi %u", u->page_id, r, db.qpn,
				db.wqe_index, db.ds, db.next_pi);
			if (!qp || qp->state == IBV_QPS_RESET || qp->state == IBV_QPS_INIT || qp->state == IBV_QPS_RTR) {
				nic->stats->db_ignored++;
				EMU_LOG("doorbell for qpn 0x%x ignored (no such QP or not RTS)", db.qpn);
				continue;
			}
			work += qp_doorbell(nic, qp, u, r, v, &db);
			if (u->devx)
				work += dbr_recovery(nic, u, qp);
		}
	}
	return work;
}
