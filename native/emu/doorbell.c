/* The emulated NIC's doorbells (ref §3): UAR pages are ordinary memory, so
 * the NIC samples their doorbell registers instead of trapping the stores. */
#include <string.h>

#include "emu_internal.h"

/* ---- doorbells (ref §3) ---------------------------------------------------- */
/* A UAR page shared by several QPs is sampled, not trapped: when two QPs ring
 * the same register between two samples only the last doorbell is seen.  The
 * other QPs on that page then catch up from their doorbell records (DBR+4 =
 * BE32(pi & 0xffff), ref §3.1), as a NIC's doorbell recovery would. */
static int dbr_recovery(struct emu_nic *nic, struct emu_uar *u, struct emu_qp *rung)
{
	int work = 0;
	for (int i = 0; i < nic->nq; i++) {
		struct emu_qp *q = nic->qlist[i];
		if (q == rung || q->uar != u->page || !q->dbrec || q->state != IBV_QPS_RTS)
			continue;
		uint16_t pi = (uint16_t)(be32toh(q->dbrec[ST_MLX5_SND_DBR]) & 0xffff);
		uint16_t ahead = (uint16_t)(pi - (uint16_t)q->sq_announced);
		if (ahead && ahead <= q->sq_wqebb && (uint16_t)(pi - (q->sq_exec & 0xffff)) <= q->sq_wqebb) {
			q->sq_announced = pi;
			work++;
		}
	}
	return work;
}

int emu_scan_uars(struct emu_nic *nic)
{
	int work = 0;
	for (struct emu_uar *u = nic->uars; u; u = u->next) {
		int nreg = u->devx ? 4 : 1;
		for (int r = 0; r < nreg; r++) {
			uint64_t v = __atomic_load_n((uint64_t *)(u->page + ST_MLX5_BF_OFFSET + 0x100 * r), __ATOMIC_ACQUIRE);
			if (v == u->last[r])
				continue;
			u->last[r] = v;
			uint8_t b[8];
			memcpy(b, &v, 8);
			struct st_mlx5_db db = st_mlx5_decode_db(b);
			struct emu_qp *qp = emu_qp_lookup(nic, db.qpn);
			EMU_LOG("doorbell uar %u reg %d: qpn 0x%x idx %u ds %u -> pi %u", u->page_id, r, db.qpn,
				db.wqe_index, db.ds, db.next_pi);
			if (!qp || qp->state == IBV_QPS_RESET || qp->state == IBV_QPS_INIT || qp->state == IBV_QPS_RTR) {
				EMU_LOG("doorbell for qpn 0x%x ignored (no such QP or not RTS)", db.qpn);
				continue;
			}
			/* accept only a producer index that moves forward by at most the ring size */
			if ((uint16_t)(db.next_pi - (qp->sq_exec & 0xffff)) <= qp->sq_wqebb)
				qp->sq_announced = db.next_pi;
			work++;
			if (u->devx)
				work += dbr_recovery(nic, u, qp);
		}
	}
	return work;
}
