/* libibverbs.so.1 of the emulated HCA: posting work.  ibv_post_send and the
 * ibv_wr_* builder write real mlx5 send WQEs, then DBR + the 8-byte UAR
 * doorbell (ref §1, §3); ibv_post_recv and ibv_post_srq_recv write mlx5
 * receive WQEs and the receive doorbell record.  The NIC learns of work
 * only from these bytes. */
#include <errno.h>
#include <string.h>

#include "emu_internal.h"

/* ---- QPs ------------------------------------------------------------------ */
/* SIGMATRACE_EMU_BF_POST: ring the doorbell the way rdma-core's mlx5 post_send does (ref §3.2):
 * at the bfreg's current half, which then flips for the next post of any QP on that bfreg; a
 * doorbell that announces one WQE of at most 256 bytes is a BlueFlame copy of it, in 8-byte
 * stores in order (else the 8-byte doorbell); a bfreg several QPs share is held under its lock
 * meanwhile, as rdma-core holds its per-bfreg lock.  A real NIC takes the copy as one burst: a
 * store of someone else landing inside it would make the NIC execute a torn WQE.  The emulated
 * NIC samples the register and would not see that, so the writer checks its own burst: after
 * every store, the ones before it must still be there (bf_torn, an error).  With
 * SIGMATRACE_EMU_BF_BURST_NS the stores are spread over that long (a slow write-combining flush),
 * which makes a foreign store inside a burst likely when it can happen at all. */
static int bf_copy_torn(volatile uint64_t *dst, const uint64_t *src, uint32_t n, uint64_t burst_ns)
{
	uint64_t t0 = burst_ns ? emu_now_ns() : 0;
	for (uint32_t i = 0; i < n; i++) {
		__atomic_store_n(&dst[i], src[i], __ATOMIC_RELAXED);
		while (burst_ns && emu_now_ns() - t0 < burst_ns * (i + 1) / n)
			;
		for (uint32_t k = 0; k < i; k++)
			if (__atomic_load_n(&dst[k], __ATOMIC_RELAXED) != src[k])
				return 1;
	}
	return 0;
}

static void qp_ring_bfreg(struct emu_qp *qp, const struct st_mlx5_wqe_ctrl_seg *last, uint32_t idx)
{
	struct emu_uar *u = qp->uarobj;
	uint32_t nbb = st_mlx5_wqebbs(st_mlx5_ctrl_ds(last)), b = (qp->bf_off >> 9) & 3;
	int shared = u->refs > 1;
	if (shared)
		pthread_spin_lock(&u->bf_lock);
	uint32_t off = qp->bf_off + (u->bf_half[b] ? 0x100 : 0);
	volatile uint64_t *reg = (volatile uint64_t *)(qp->uar + off);
	if (nbb <= 4 && qp->sq_pi - qp->sq_rung == nbb) {
		uint64_t wqe[32];
		emu_sq_bytes(qp, idx, (uint8_t *)wqe, nbb * 64);
		/* what the NIC may find under a later 8-byte doorbell on this register (doorbell.c) */
		uint64_t *note = u->bf_written[((off - ST_MLX5_BF_OFFSET) >> 8) & 3];
		for (uint32_t i = 0; i < nbb * 8; i++)
			__atomic_store_n(&note[i], wqe[i], __ATOMIC_RELAXED);
		__atomic_fetch_add(&qp->nic->stats->bf_posted, 1, __ATOMIC_RELAXED);
		if (bf_copy_torn(reg, wqe, nbb * 8, qp->nic->bf_burst_ns)) {
			__atomic_fetch_add(&qp->nic->stats->bf_torn, 1, __ATOMIC_RELAXED);
			EMU_ERR("BlueFlame ERROR: another write landed inside the copy of qp 0x%x wqe %u (a NIC would execute "
				"a torn WQE)", qp->qpn, idx);
		}
	} else {
		uint64_t v;
		memcpy(&v, last, 8);
		__atomic_store_n(reg, v, __ATOMIC_RELAXED);
	}
	__atomic_thread_fence(__ATOMIC_SEQ_CST); /* mmio_flush_writes */
	u->bf_half[b] ^= 1;
	if (shared)
		pthread_spin_unlock(&u->bf_lock);
}

static void qp_ring_doorbell(struct emu_qp *qp, struct st_mlx5_wqe_ctrl_seg *last)
{
	/* ref §3.4 ordering: WQEs -> barrier -> DBR -> barrier -> 8-byte DB */
	__atomic_thread_fence(__ATOMIC_RELEASE);
	qp->dbrec[ST_MLX5_SND_DBR] = htobe32(qp->sq_pi & 0xffff);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (qp->nic->bf_post && qp->uarobj) {
		qp_ring_bfreg(qp, last, st_mlx5_ctrl_wqe_index(last));
	} else {
		uint64_t v;
		memcpy(&v, last, 8);
		__atomic_store_n((uint64_t *)(qp->uar + qp->bf_off), v, __ATOMIC_RELEASE);
	}
	qp->sq_rung = qp->sq_pi;
	emu_nic_kick(qp->nic);
}

static inline uint8_t *sq_ptr(struct emu_qp *qp, uint32_t idx, uint32_t off)
{
	uint32_t ring = qp->sq_wqebb * 64;
	return qp->sq_buf + (((idx & (qp->sq_wqebb - 1)) * 64 + off) & (ring - 1));
}

static void sq_copy_in(struct emu_qp *qp, uint32_t idx, uint32_t off, const void *src, uint32_t len)
{
	uint32_t ring = qp->sq_wqebb * 64;
	uint32_t pos = ((idx & (qp->sq_wqebb - 1)) * 64 + off) & (ring - 1);
	const uint8_t *s = src;
	while (len) {
		uint32_t n = ring - pos;
		if (n > len)
			n = len;
		memcpy(qp->sq_buf + pos, s, n);
		s += n;
		len -= n;
		pos = 0;
	}
}

/* The datagram segment of a UD WQE (ref §1.8): the AH's address vector with
 * the destination QP and Q_Key, as rdma-core's set_datagram_seg writes it. */
static void set_datagram_seg(struct emu_qp *qp, uint32_t idx, uint32_t off, struct ibv_ah *ah, uint32_t rqpn,
			     uint32_t qkey)
{
	struct mlx5_wqe_av av = ((struct emu_ah *)ah)->av;
	av.dqp_dct = htobe32(rqpn | MLX5_EXTENDED_UD_AV);
	av.key.qkey.qkey = htobe32(qkey);
	sq_copy_in(qp, idx, off, &av, sizeof av);
}

static int wr_to_mlx5_opcode(enum ibv_wr_opcode op)
{
	switch (op) {
	case IBV_WR_RDMA_WRITE: return ST_MLX5_OPCODE_RDMA_WRITE;
	case IBV_WR_RDMA_WRITE_WITH_IMM: return ST_MLX5_OPCODE_RDMA_WRITE_IMM;
	case IBV_WR_SEND: return ST_MLX5_OPCODE_SEND;
	case IBV_WR_SEND_WITH_IMM: return ST_MLX5_OPCODE_SEND_IMM;
	case IBV_WR_RDMA_READ: return ST_MLX5_OPCODE_RDMA_READ;
	case IBV_WR_ATOMIC_CMP_AND_SWP: return ST_MLX5_OPCODE_ATOMIC_CS;
	case IBV_WR_ATOMIC_FETCH_AND_ADD: return ST_MLX5_OPCODE_ATOMIC_FA;
	case IBV_WR_SEND_WITH_INV: return ST_MLX5_OPCODE_SEND_INVAL;
	default: return -1;
	}
}

int emu_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct emu_qp *qp = to_eqp(ibqp);
	int err = 0;
	struct st_mlx5_wqe_ctrl_seg *last = NULL;
	pthread_spin_lock(&qp->sq_lock);
	if (qp->state == IBV_QPS_RESET || qp->state == IBV_QPS_INIT || qp->state == IBV_QPS_RTR) {
		*bad = wr;
		pthread_spin_unlock(&qp->sq_lock);
		return EINVAL;
	}
	for (; wr; wr = wr->next) {
		int opc = wr_to_mlx5_opcode(wr->opcode);
		if (opc < 0 || wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->max_send_sge) {
			err = EINVAL;
			break;
		}
		uint32_t idx = qp->sq_pi;
		uint32_t off = 16;
		int is_ud = qp->qp_type == IBV_QPT_UD;
		if (is_ud && opc != ST_MLX5_OPCODE_SEND && opc != ST_MLX5_OPCODE_SEND_IMM) {
			err = EINVAL;
			break;
		}
		if (is_ud && !wr->wr.ud.ah) {
			err = EINVAL;
			break;
		}
		int is_rdma = opc == ST_MLX5_OPCODE_RDMA_WRITE || opc == ST_MLX5_OPCODE_RDMA_WRITE_IMM ||
			      opc == ST_MLX5_OPCODE_RDMA_READ;
		int is_atomic = opc == ST_MLX5_OPCODE_ATOMIC_CS || opc == ST_MLX5_OPCODE_ATOMIC_FA;
		/* compute size first to check space */
		uint32_t inl = 0, ds;
		int use_inline = (wr->send_flags & IBV_SEND_INLINE) && !is_atomic && opc != ST_MLX5_OPCODE_RDMA_READ;
		if (use_inline) {
			for (int i = 0; i < wr->num_sge; i++)
				inl += wr->sg_list[i].length;
			if (inl > qp->max_inline) {
				err = EINVAL;
				break;
			}
			ds = 1 + (is_rdma ? 1 : 0) + (is_ud ? 3 : 0) + (inl ? st_mlx5_inline_ds(inl) : 0);
		} else {
			int nsg = 0;
			for (int i = 0; i < wr->num_sge; i++)
				nsg += wr->sg_list[i].length ? 1 : 0;
			if (is_atomic)
				nsg = 1;
			ds = 1 + ((is_rdma || is_atomic) ? 1 : 0) + (is_atomic ? 1 : 0) + (is_ud ? 3 : 0) + (uint32_t)nsg;
		}
		uint32_t nbb = st_mlx5_wqebbs(ds);
		if (qp->sq_pi + nbb - qp->sq_tail > qp->sq_wqebb) {
			err = ENOMEM;
			break;
		}
		if (is_ud) {
			set_datagram_seg(qp, idx, off, wr->wr.ud.ah, wr->wr.ud.remote_qpn, wr->wr.ud.remote_qkey);
			off += sizeof(struct mlx5_wqe_av);
		}
		if (is_rdma || is_atomic) {
			uint64_t ra = is_atomic ? wr->wr.atomic.remote_addr : wr->wr.rdma.remote_addr;
			uint32_t rk = is_atomic ? wr->wr.atomic.rkey : wr->wr.rdma.rkey;
			st_mlx5_set_raddr_seg((struct st_mlx5_wqe_raddr_seg *)sq_ptr(qp, idx, off), ra, rk);
			off += 16;
		}
		if (is_atomic) {
			uint64_t sa = opc == ST_MLX5_OPCODE_ATOMIC_CS ? wr->wr.atomic.swap : wr->wr.atomic.compare_add;
			uint64_t cmp = opc == ST_MLX5_OPCODE_ATOMIC_CS ? wr->wr.atomic.compare_add : 0;
			st_mlx5_set_atomic_seg((struct st_mlx5_wqe_atomic_seg *)sq_ptr(qp, idx, off), sa, cmp);
			off += 16;
			if (wr->num_sge < 1) {
				err = EINVAL;
				break;
			}
			st_mlx5_set_data_seg((struct st_mlx5_wqe_data_seg *)sq_ptr(qp, idx, off), 8,
					     wr->sg_list[0].lkey, wr->sg_list[0].addr);
			off += 16;
		} else if (use_inline) {
			if (inl) {
				uint32_t bc = htobe32(inl | ST_MLX5_INLINE_SEG);
				sq_copy_in(qp, idx, off, &bc, 4);
				uint32_t p = off + 4;
				for (int i = 0; i < wr->num_sge; i++) {
					sq_copy_in(qp, idx, p, (void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
					p += wr->sg_list[i].length;
				}
				off += st_mlx5_inline_ds(inl) * 16;
			}
		} else {
			for (int i = 0; i < wr->num_sge; i++) {
				if (!wr->sg_list[i].length)
					continue;
				st_mlx5_set_data_seg((struct st_mlx5_wqe_data_seg *)sq_ptr(qp, idx, off),
						     wr->sg_list[i].length, wr->sg_list[i].lkey, wr->sg_list[i].addr);
				off += 16;
			}
		}
		uint8_t fm = 0;
		if ((wr->send_flags & IBV_SEND_SIGNALED) || qp->sq_sig_all)
			fm |= ST_MLX5_WQE_CTRL_CQ_UPDATE;
		if (wr->send_flags & IBV_SEND_SOLICITED)
			fm |= ST_MLX5_WQE_CTRL_SOLICITED;
		if (wr->send_flags & IBV_SEND_FENCE)
			fm |= ST_MLX5_WQE_CTRL_FENCE;
		uint32_t imm = 0;
		if (opc == ST_MLX5_OPCODE_SEND_IMM || opc == ST_MLX5_OPCODE_RDMA_WRITE_IMM)
			imm = wr->imm_data;
		else if (opc == ST_MLX5_OPCODE_SEND_INVAL)
			imm = htobe32(wr->invalidate_rkey);
		struct st_mlx5_wqe_ctrl_seg *ctrl = (struct st_mlx5_wqe_ctrl_seg *)sq_ptr(qp, idx, 0);
		st_mlx5_set_ctrl_seg(ctrl, 0, (uint16_t)idx, (uint8_t)opc, qp->qpn, off / 16, fm, imm);
		uint32_t slot = idx & (qp->sq_wqebb - 1);
		qp->sq_wrid[slot] = wr->wr_id;
		qp->sq_next[slot] = qp->sq_pi + nbb;
		qp->sq_pi += nbb;
		last = ctrl;
	}
	if (err)
		*bad = wr;
	if (last)
		qp_ring_doorbell(qp, last);
	pthread_spin_unlock(&qp->sq_lock);
	return err;
}

static void write_recv_wqe(uint8_t *wq, uint32_t stride, struct ibv_recv_wr *wr)
{
	uint32_t nseg = stride / 16, i;
	for (i = 0; i < (uint32_t)wr->num_sge; i++)
		st_mlx5_set_data_seg((struct st_mlx5_wqe_data_seg *)(wq + 16 * i), wr->sg_list[i].length,
				     wr->sg_list[i].lkey, wr->sg_list[i].addr);
	if (i < nseg) {
		struct st_mlx5_wqe_data_seg *d = (void *)(wq + 16 * i);
		d->byte_count = 0;
		d->lkey = htobe32(ST_MLX5_INVALID_LKEY);
		d->addr = 0;
	}
}

/* A receive ring as posting fills it: a QP's RQ or an SRQ. */
struct recv_ring {
	uint8_t *buf;
	uint32_t stride, wqe_cnt, max_sge;
	uint32_t room;            /* WQEs that may be outstanding at once */
	uint64_t *wrid;
	uint32_t *pi;             /* the application's producer index */
	const uint32_t *done;     /* WQEs no longer outstanding (RQ: completions polled, SRQ: taken by the NIC) */
	volatile uint32_t *dbrec; /* the ring's doorbell record */
	struct emu_nic *nic;
};

/* Write the receive WQEs of the chain wr, then the doorbell record and a kick
 * when any were written.  Returns 0, or the error of the first request not
 * posted, which goes to *bad. */
static int post_recv_ring(const struct recv_ring *r, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	int err = 0;
	uint32_t first = *r->pi;
	for (; wr; wr = wr->next) {
		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > r->max_sge) {
			err = EINVAL;
			break;
		}
		if (*r->pi - __atomic_load_n(r->done, __ATOMIC_ACQUIRE) >= r->room) {
			err = ENOMEM;
			break;
		}
		uint32_t slot = *r->pi & (r->wqe_cnt - 1);
		write_recv_wqe(r->buf + (size_t)slot * r->stride, r->stride, wr);
		r->wrid[slot] = wr->wr_id;
		(*r->pi)++;
	}
	if (*r->pi != first) {
		__atomic_thread_fence(__ATOMIC_RELEASE);
		*r->dbrec = htobe32(*r->pi & 0xffff);
		emu_nic_kick(r->nic);
	}
	if (err)
		*bad = wr;
	return err;
}

int emu_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct emu_qp *qp = to_eqp(ibqp);
	if (qp->srq) {
		*bad = wr;
		return EINVAL;
	}
	pthread_spin_lock(&qp->rq_lock);
	if (qp->state == IBV_QPS_RESET) {
		*bad = wr;
		pthread_spin_unlock(&qp->rq_lock);
		return EINVAL;
	}
	struct recv_ring ring = { qp->rq_buf, qp->rq_stride, qp->rq_wqe_cnt, qp->rq_max_sge, qp->rq_wqe_cnt,
				  qp->rq_wrid, &qp->rq_pi, &qp->rq_tail, &qp->dbrec[ST_MLX5_RCV_DBR], qp->nic };
	int err = post_recv_ring(&ring, wr, bad);
	pthread_spin_unlock(&qp->rq_lock);
	return err;
}

/* rdma-core's mlx5 SRQ posting: the WQE at the head of the free list gets
 * the scatter list, the head moves along its link, the doorbell record
 * counts it.  The list is full when head meets tail (one WQE stays free). */
int emu_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct emu_srq *s = (struct emu_srq *)srq;
	int err = 0, n = 0;
	pthread_spin_lock(&s->plock);
	for (; wr; wr = wr->next) {
		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > s->max_sge) {
			err = EINVAL;
			break;
		}
		if (s->head == s->tail) {
			err = ENOMEM;
			break;
		}
		uint8_t *w = s->buf + (size_t)s->head * s->stride;
		write_recv_wqe(w + 16, s->stride - 16, wr);
		s->wrid[s->head] = wr->wr_id;
		uint16_t next;
		memcpy(&next, w + 2, 2);
		s->head = be16toh(next) & (s->wqe_cnt - 1);
		s->counter++;
		n++;
	}
	if (n) {
		__atomic_thread_fence(__ATOMIC_RELEASE);
		s->dbrec[0] = htobe32(s->counter);
		emu_nic_kick(to_ectx(srq->context)->nic);
	}
	if (err)
		*bad = wr;
	pthread_spin_unlock(&s->plock);
	return err;
}

/* ibv_qp_ex work-request builder (used by ibv_wr_* inline helpers) */
static inline struct emu_qp *xq(struct ibv_qp_ex *q) { return (struct emu_qp *)q; }

static void wr_finalize(struct emu_qp *qp)
{
	if (!qp->wr_ctrl)
		return;
	uint32_t idx = qp->sq_pi;
	uint8_t fm = 0;
	unsigned fl = qp->qpx.wr_flags;
	if ((fl & IBV_SEND_SIGNALED) || qp->sq_sig_all)
		fm |= ST_MLX5_WQE_CTRL_CQ_UPDATE;
	if (fl & IBV_SEND_SOLICITED)
		fm |= ST_MLX5_WQE_CTRL_SOLICITED;
	if (fl & IBV_SEND_FENCE)
		fm |= ST_MLX5_WQE_CTRL_FENCE;
	qp->wr_ctrl->qpn_ds = htobe32((qp->qpn << 8) | qp->wr_ds);
	qp->wr_ctrl->fm_ce_se = fm;
	uint32_t nbb = st_mlx5_wqebbs(qp->wr_ds);
	uint32_t slot = idx & (qp->sq_wqebb - 1);
	qp->sq_next[slot] = qp->sq_pi + nbb;
	qp->sq_pi += nbb;
	qp->wr_cur_bb = 0;
}

static struct st_mlx5_wqe_ctrl_seg *wr_begin(struct emu_qp *qp, uint8_t opc, uint32_t imm)
{
	if (qp->wr_ctrl) {
		wr_finalize(qp);
		qp->wr_ctrl = NULL;
	}
	if (qp->sq_pi + qp->sq_max_wqe_bb - qp->sq_tail > qp->sq_wqebb) {
		qp->wr_err = ENOMEM;
		return NULL;
	}
	uint32_t idx = qp->sq_pi;
	struct st_mlx5_wqe_ctrl_seg *c = (struct st_mlx5_wqe_ctrl_seg *)sq_ptr(qp, idx, 0);
	st_mlx5_set_ctrl_seg(c, 0, (uint16_t)idx, opc, qp->qpn, 1, 0, imm);
	qp->sq_wrid[idx & (qp->sq_wqebb - 1)] = qp->qpx.wr_id;
	qp->wr_ctrl = c;
	qp->wr_ds = 1;
	qp->wr_opcode = opc;
	return c;
}

static void wr_raddr(struct emu_qp *qp, uint32_t rkey, uint64_t addr)
{
	st_mlx5_set_raddr_seg((struct st_mlx5_wqe_raddr_seg *)sq_ptr(qp, qp->sq_pi, qp->wr_ds * 16), addr, rkey);
	qp->wr_ds++;
}

static void x_rdma_write(struct ibv_qp_ex *q, uint32_t rkey, uint64_t addr)
{ if (wr_begin(xq(q), ST_MLX5_OPCODE_RDMA_WRITE, 0)) wr_raddr(xq(q), rkey, addr); }
static void x_rdma_write_imm(struct ibv_qp_ex *q, uint32_t rkey, uint64_t addr, __be32 imm)
{ if (wr_begin(xq(q), ST_MLX5_OPCODE_RDMA_WRITE_IMM, imm)) wr_raddr(xq(q), rkey, addr); }
static void x_rdma_read(struct ibv_qp_ex *q, uint32_t rkey, uint64_t addr)
{ if (wr_begin(xq(q), ST_MLX5_OPCODE_RDMA_READ, 0)) wr_raddr(xq(q), rkey, addr); }
static void x_send(struct ibv_qp_ex *q) { wr_begin(xq(q), ST_MLX5_OPCODE_SEND, 0); }
static void x_send_imm(struct ibv_qp_ex *q, __be32 imm) { wr_begin(xq(q), ST_MLX5_OPCODE_SEND_IMM, imm); }
static void x_send_inv(struct ibv_qp_ex *q, uint32_t rkey) { wr_begin(xq(q), ST_MLX5_OPCODE_SEND_INVAL, htobe32(rkey)); }
static void x_atomic(struct emu_qp *qp, uint8_t opc, uint32_t rkey, uint64_t addr, uint64_t sa, uint64_t cmp)
{
	if (!wr_begin(qp, opc, 0))
		return;
	wr_raddr(qp, rkey, addr);
	st_mlx5_set_atomic_seg((struct st_mlx5_wqe_atomic_seg *)sq_ptr(qp, qp->sq_pi, qp->wr_ds * 16), sa, cmp);
	qp->wr_ds++;
}
static void x_cas(struct ibv_qp_ex *q, uint32_t rkey, uint64_t addr, uint64_t cmp, uint64_t swap)
{ x_atomic(xq(q), ST_MLX5_OPCODE_ATOMIC_CS, rkey, addr, swap, cmp); }
static void x_faa(struct ibv_qp_ex *q, uint32_t rkey, uint64_t addr, uint64_t add)
{ x_atomic(xq(q), ST_MLX5_OPCODE_ATOMIC_FA, rkey, addr, add, 0); }
static void x_unsupported(struct ibv_qp_ex *q) { xq(q)->wr_err = EOPNOTSUPP; }
static void x_local_inv(struct ibv_qp_ex *q, uint32_t k) { x_unsupported(q); }
static void x_bind_mw(struct ibv_qp_ex *q, struct ibv_mw *mw, uint32_t rkey, const struct ibv_mw_bind_info *bi) { x_unsupported(q); }
static void x_send_tso(struct ibv_qp_ex *q, void *h, uint16_t hs, uint16_t mss) { x_unsupported(q); }
static void x_set_ud_addr(struct ibv_qp_ex *q, struct ibv_ah *ah, uint32_t rqpn, uint32_t qkey)
{
	struct emu_qp *qp = xq(q);
	if (!qp->wr_ctrl)
		return;
	if (qp->qp_type != IBV_QPT_UD || !ah) {
		qp->wr_err = EINVAL;
		return;
	}
	set_datagram_seg(qp, qp->sq_pi, qp->wr_ds * 16, ah, rqpn, qkey);
	qp->wr_ds += sizeof(struct mlx5_wqe_av) / 16;
}
static void x_set_xrc_srqn(struct ibv_qp_ex *q, uint32_t srqn) { x_unsupported(q); }
static void x_atomic_write(struct ibv_qp_ex *q, uint32_t rkey, uint64_t addr, const void *v) { x_unsupported(q); }

static void x_set_sge(struct ibv_qp_ex *q, uint32_t lkey, uint64_t addr, uint32_t len)
{
	struct emu_qp *qp = xq(q);
	if (!qp->wr_ctrl)
		return;
	if (qp->wr_opcode == ST_MLX5_OPCODE_ATOMIC_CS || qp->wr_opcode == ST_MLX5_OPCODE_ATOMIC_FA)
		len = 8;
	if (!len)
		return;
	st_mlx5_set_data_seg((struct st_mlx5_wqe_data_seg *)sq_ptr(qp, qp->sq_pi, qp->wr_ds * 16), len, lkey, addr);
	qp->wr_ds++;
}
static void x_set_sge_list(struct ibv_qp_ex *q, size_t n, const struct ibv_sge *sg)
{
	if (n > xq(q)->max_send_sge) {
		xq(q)->wr_err = EINVAL;
		return;
	}
	for (size_t i = 0; i < n; i++)
		x_set_sge(q, sg[i].lkey, sg[i].addr, sg[i].length);
}
static void x_set_inline_list(struct ibv_qp_ex *q, size_t n, const struct ibv_data_buf *b)
{
	struct emu_qp *qp = xq(q);
	if (!qp->wr_ctrl)
		return;
	uint32_t total = 0;
	for (size_t i = 0; i < n; i++)
		total += (uint32_t)b[i].length;
	if (total > qp->max_inline) {
		qp->wr_err = EINVAL;
		return;
	}
	if (!total)
		return;
	uint32_t off = qp->wr_ds * 16, bc = htobe32(total | ST_MLX5_INLINE_SEG);
	sq_copy_in(qp, qp->sq_pi, off, &bc, 4);
	off += 4;
	for (size_t i = 0; i < n; i++) {
		sq_copy_in(qp, qp->sq_pi, off, b[i].addr, (uint32_t)b[i].length);
		off += (uint32_t)b[i].length;
	}
	qp->wr_ds += st_mlx5_inline_ds(total);
}
static void x_set_inline(struct ibv_qp_ex *q, void *addr, size_t len)
{
	struct ibv_data_buf b = { addr, len };
	x_set_inline_list(q, 1, &b);
}
static void x_start(struct ibv_qp_ex *q)
{
	struct emu_qp *qp = xq(q);
	pthread_spin_lock(&qp->sq_lock);
	qp->wr_start_pi = qp->sq_pi;
	qp->wr_ctrl = NULL;
	qp->wr_err = 0;
	if (qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_ERR && qp->state != IBV_QPS_SQD)
		qp->wr_err = EINVAL;
}
static int x_complete(struct ibv_qp_ex *q)
{
	struct emu_qp *qp = xq(q);
	int err = qp->wr_err;
	if (err) {
		qp->sq_pi = qp->wr_start_pi;
		qp->wr_ctrl = NULL;
		pthread_spin_unlock(&qp->sq_lock);
		return err;
	}
	struct st_mlx5_wqe_ctrl_seg *last = qp->wr_ctrl;
	wr_finalize(qp);
	qp->wr_ctrl = NULL;
	if (last)
		qp_ring_doorbell(qp, last);
	pthread_spin_unlock(&qp->sq_lock);
	return 0;
}
static void x_abort(struct ibv_qp_ex *q)
{
	struct emu_qp *qp = xq(q);
	qp->sq_pi = qp->wr_start_pi;
	qp->wr_ctrl = NULL;
	pthread_spin_unlock(&qp->sq_lock);
}

EXPORT void emu_qp_init_ex_ops(struct emu_qp *qp)
{
	struct ibv_qp_ex *x = &qp->qpx;
	x->wr_atomic_cmp_swp = x_cas;
	x->wr_atomic_fetch_add = x_faa;
	x->wr_bind_mw = x_bind_mw;
	x->wr_local_inv = x_local_inv;
	x->wr_rdma_read = x_rdma_read;
	x->wr_rdma_write = x_rdma_write;
	x->wr_rdma_write_imm = x_rdma_write_imm;
	x->wr_send = x_send;
	x->wr_send_imm = x_send_imm;
	x->wr_send_inv = x_send_inv;
	x->wr_send_tso = x_send_tso;
	x->wr_set_ud_addr = x_set_ud_addr;
	x->wr_set_xrc_srqn = x_set_xrc_srqn;
	x->wr_set_inline_data = x_set_inline;
	x->wr_set_inline_data_list = x_set_inline_list;
	x->wr_set_sge = x_set_sge;
	x->wr_set_sge_list = x_set_sge_list;
	x->wr_start = x_start;
	x->wr_complete = x_complete;
	x->wr_abort = x_abort;
	x->wr_atomic_write = x_atomic_write;
}

EXPORT struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp) { return &to_eqp(qp)->qpx; }
