/* libibverbs.so.1 of the emulated HCA: completion channels and CQs.  A CQ
 * is a ring of 64-byte mlx5 CQEs that the NIC writes (requester.c,
 * responder.c); ibv_poll_cq decodes those bytes back into ibv_wc (ref §2.2). */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "emu_internal.h"

/* ---- completion channels and CQs ---------------------------------------- */
EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *c)
{
	struct emu_channel *ch = emu_zalloc(sizeof *ch);
	if (!ch)
		return NULL;
	int p[2];
	if (pipe2(p, O_CLOEXEC)) {
		free(ch);
		return NULL;
	}
	fcntl(p[1], F_SETFL, O_NONBLOCK);
	ch->ch.context = c;
	ch->ch.fd = p[0];
	ch->ch.refcnt = 0;
	ch->wfd = p[1];
	return &ch->ch;
}

EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *ch)
{
	if (ch->refcnt) {
		errno = EBUSY;
		return EBUSY;
	}
	struct emu_channel *e = (struct emu_channel *)ch;
	close(e->ch.fd);
	close(e->wfd);
	free(e);
	return 0;
}

EXPORT int ibv_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_context)
{
	struct ibv_cq *p;
	ssize_t r;
	size_t got = 0;
	while (got < sizeof p) {
		r = read(ch->fd, (char *)&p + got, sizeof p - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		got += (size_t)r;
	}
	*cq = p;
	*cq_context = p->cq_context;
	return 0;
}

EXPORT void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int n)
{
	pthread_mutex_lock(&cq->mutex);
	cq->comp_events_completed += n;
	pthread_cond_signal(&cq->cond);
	pthread_mutex_unlock(&cq->mutex);
}

/* A CQ of ncqe slots of cqe_size (64 or 128) bytes; buf given (DevX umem) or
 * allocated with every CQE invalid and owned by the hardware. */
EXPORT struct emu_cq *emu_cq_new_sized(struct emu_nic *nic, struct ibv_context *c, uint32_t ncqe, uint32_t cqe_size,
				       void *buf, volatile uint32_t *dbrec, int devx)
{
	struct emu_cq *cq = calloc(1, sizeof *cq);
	if (!cq)
		return NULL;
	cq->ncqe = ncqe;
	cq->cqe_size = cqe_size;
	cq->devx = devx;
	if (buf) {
		cq->buf = buf;
	} else {
		size_t bytes = (size_t)ncqe * cqe_size;
		cq->buf = aligned_alloc(4096, (bytes + 4095) & ~(size_t)4095);
		if (!cq->buf) {
			free(cq);
			return NULL;
		}
		memset(cq->buf, 0, bytes);
		for (uint32_t i = 0; i < ncqe; i++)
			emu_cqe_at(cq, i)->op_own = (ST_MLX5_CQE_INVALID << 4) | 1;
		cq->own_buf = 1;
	}
	cq->dbrec = dbrec ? dbrec : (volatile uint32_t *)cq->dbr_storage;
	pthread_mutex_init(&cq->lock, NULL);
	pthread_spin_init(&cq->poll_lock, PTHREAD_PROCESS_PRIVATE);
	cq->cq.context = c;
	cq->cq.cqe = (int)ncqe - 1;
	pthread_mutex_init(&cq->cq.mutex, NULL);
	pthread_cond_init(&cq->cq.cond, NULL);
	pthread_mutex_lock(&nic->lock);
	int r = emu_cq_register(nic, cq);
	pthread_mutex_unlock(&nic->lock);
	if (r) {
		if (cq->own_buf)
			free(cq->buf);
		free(cq);
		return NULL;
	}
	cq->cq.handle = cq->cqn;
	return cq;
}

EXPORT struct emu_cq *emu_cq_new(struct emu_nic *nic, struct ibv_context *c, uint32_t ncqe, void *buf,
				 volatile uint32_t *dbrec, int devx)
{
	return emu_cq_new_sized(nic, c, ncqe, 64, buf, dbrec, devx);
}

EXPORT void emu_cq_free(struct emu_nic *nic, struct emu_cq *cq)
{
	pthread_mutex_lock(&nic->lock);
	if (cq->cqn < EMU_MAX_CQ && nic->cqs[cq->cqn] == cq)
		nic->cqs[cq->cqn] = NULL;
	pthread_mutex_unlock(&nic->lock);
	if (cq->own_buf)
		free(cq->buf);
	emu_buf_free(&cq->cbuf);
	emu_buf_free(&cq->dbuf);
	free(cq);
}

EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *c, int cqe, void *cq_context, struct ibv_comp_channel *ch,
				    int comp_vector)
{
	if (cqe < 1 || cqe > 4194303 || comp_vector < 0 || comp_vector >= c->num_comp_vectors) {
		errno = EINVAL;
		return NULL;
	}
	struct emu_nic *nic = to_ectx(c)->nic;
	struct emu_cq *cq = emu_cq_new(nic, c, roundup_pow2((uint32_t)cqe + 1), NULL, NULL, 0);
	if (!cq) {
		errno = ENOMEM;
		return NULL;
	}
	cq->cq.cq_context = cq_context;
	cq->cq.channel = ch;
	if (ch) {
		pthread_mutex_lock(&c->mutex);
		ch->refcnt++;
		pthread_mutex_unlock(&c->mutex);
	}
	return &cq->cq;
}

EXPORT int ibv_destroy_cq(struct ibv_cq *ibcq)
{
	struct emu_cq *cq = to_ecq(ibcq);
	struct emu_nic *nic = to_ectx(ibcq->context)->nic;
	pthread_mutex_lock(&nic->lock);
	for (int i = 0; i < nic->nq; i++)
		if (nic->qlist[i]->scq == cq || nic->qlist[i]->rcq == cq) {
			pthread_mutex_unlock(&nic->lock);
			errno = EBUSY;
			return EBUSY;
		}
	pthread_mutex_unlock(&nic->lock);
	if (ibcq->channel) {
		pthread_mutex_lock(&ibcq->context->mutex);
		ibcq->channel->refcnt--;
		pthread_mutex_unlock(&ibcq->context->mutex);
	}
	emu_cq_free(nic, cq);
	return 0;
}

EXPORT int ibv_resize_cq(struct ibv_cq *cq, int cqe)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

/* Post the CQ to its completion channel and disarm (cq->lock held). */
static void cq_fire(struct emu_cq *cq)
{
	cq->armed = 0;
	if (!cq->cq.channel)
		return;
	struct ibv_cq *p = &cq->cq;
	int wfd = ((struct emu_channel *)cq->cq.channel)->wfd;
	ssize_t r = write(wfd, &p, sizeof p);
	(void)r;
	cq->events++;
}

/* An armed CQ gets an event for its next CQE (solicited: the next CQE with
 * SE set, or an error), and at once when such a CQE is already there at or
 * after the consumer index ci the arm names -- as the hardware compares the
 * arm's ci with its producer index, so that arming after a last empty poll
 * loses no completion.  Called from ibv_req_notify_cq and for arm doorbells
 * (UAR + 0x20, e.g. UCX's uct_ib_mlx5dv_arm_cq). */
EXPORT void emu_cq_arm(struct emu_cq *cq, int sol, uint32_t ci)
{
	pthread_mutex_lock(&cq->lock);
	cq->armed = 1;
	cq->arm_sol = sol;
	if (!cq->collapsed) {
		uint32_t pending = (cq->pi - ci) & 0xffffff;
		if (pending > cq->ncqe)
			pending = cq->ncqe;
		for (uint32_t k = 0; k < pending; k++) {
			uint8_t op_own = emu_cqe_at(cq, ci + k)->op_own, opc = op_own >> 4;
			if (!sol || (op_own & 2) || opc == ST_MLX5_CQE_REQ_ERR || opc == ST_MLX5_CQE_RESP_ERR) {
				cq_fire(cq);
				break;
			}
		}
	}
	pthread_mutex_unlock(&cq->lock);
}

/* emu_cq_write (requester.c): a CQE was just written (cq->lock held). */
EXPORT void emu_cq_written(struct emu_cq *cq, uint8_t op_own)
{
	if (!cq->armed)
		return;
	uint8_t opc = op_own >> 4;
	if (!cq->arm_sol || (op_own & 2) || opc == ST_MLX5_CQE_REQ_ERR || opc == ST_MLX5_CQE_RESP_ERR)
		cq_fire(cq);
}

int emu_req_notify_cq(struct ibv_cq *ibcq, int sol)
{
	struct emu_cq *cq = to_ecq(ibcq);
	/* arm doorbell record (ref §2.2): sn<<28 | cmd | ci */
	cq->dbrec[ST_MLX5_CQ_ARM_DB] = htobe32(((cq->events & 3) << 28) |
					       (sol ? ST_MLX5_CQ_DB_REQ_NOT_SOL : ST_MLX5_CQ_DB_REQ_NOT) |
					       (cq->ci & 0xffffff));
	emu_cq_arm(cq, sol, cq->ci);
	return 0;
}

static enum ibv_wc_status syndrome_to_status(uint8_t s)
{
	switch (s) {
	case ST_MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR: return IBV_WC_LOC_LEN_ERR;
	case ST_MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR: return IBV_WC_LOC_QP_OP_ERR;
	case ST_MLX5_CQE_SYNDROME_LOCAL_PROT_ERR: return IBV_WC_LOC_PROT_ERR;
	case ST_MLX5_CQE_SYNDROME_WR_FLUSH_ERR: return IBV_WC_WR_FLUSH_ERR;
	case ST_MLX5_CQE_SYNDROME_MW_BIND_ERR: return IBV_WC_MW_BIND_ERR;
	case ST_MLX5_CQE_SYNDROME_BAD_RESP_ERR: return IBV_WC_BAD_RESP_ERR;
	case ST_MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR: return IBV_WC_LOC_ACCESS_ERR;
	case ST_MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR: return IBV_WC_REM_INV_REQ_ERR;
	case ST_MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR: return IBV_WC_REM_ACCESS_ERR;
	case ST_MLX5_CQE_SYNDROME_REMOTE_OP_ERR: return IBV_WC_REM_OP_ERR;
	case ST_MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR: return IBV_WC_RETRY_EXC_ERR;
	case ST_MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR: return IBV_WC_RNR_RETRY_EXC_ERR;
	case ST_MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR: return IBV_WC_REM_ABORT_ERR;
	default: return IBV_WC_GENERAL_ERR;
	}
}

static enum ibv_wc_opcode send_op_to_wc(uint8_t op)
{
	switch (op) {
	case ST_MLX5_OPCODE_RDMA_WRITE:
	case ST_MLX5_OPCODE_RDMA_WRITE_IMM: return IBV_WC_RDMA_WRITE;
	case ST_MLX5_OPCODE_RDMA_READ: return IBV_WC_RDMA_READ;
	case ST_MLX5_OPCODE_ATOMIC_CS: return IBV_WC_COMP_SWAP;
	case ST_MLX5_OPCODE_ATOMIC_FA: return IBV_WC_FETCH_ADD;
	case ST_MLX5_OPCODE_UMR: return IBV_WC_LOCAL_INV;
	default: return IBV_WC_SEND;
	}
}

/* An SRQ WQE whose receive completed is free again: link it after the tail
 * (as rdma-core's mlx5_free_srq_wqe). */
static void srq_wqe_free(struct emu_srq *s, uint16_t wqe_counter)
{
	uint32_t idx = wqe_counter & (s->wqe_cnt - 1);
	pthread_spin_lock(&s->plock);
	uint16_t be = htobe16((uint16_t)idx);
	memcpy(s->buf + (size_t)s->tail * s->stride + 2, &be, 2);
	s->tail = idx;
	pthread_spin_unlock(&s->plock);
}

int emu_poll_cq(struct ibv_cq *ibcq, int n, struct ibv_wc *wc)
{
	struct emu_cq *cq = to_ecq(ibcq);
	struct emu_nic *nic = to_ectx(ibcq->context)->nic;
	int got = 0;
	pthread_spin_lock(&cq->poll_lock);
	while (got < n) {
		const struct st_mlx5_cqe64 *c = emu_cqe_at(cq, cq->ci);
		uint8_t op_own = __atomic_load_n(&c->op_own, __ATOMIC_ACQUIRE);
		if ((op_own >> 4) == ST_MLX5_CQE_INVALID || (op_own & 1) != !!(cq->ci & cq->ncqe))
			break;
		struct ibv_wc *w = &wc[got];
		memset(w, 0, sizeof *w);
		uint8_t opc = op_own >> 4;
		uint32_t qpn = be32toh(c->sop_drop_qpn) & 0xffffff;
		uint16_t ctr = be16toh(c->wqe_counter);
		struct emu_qp *qp = emu_qp_lookup(nic, qpn);
		w->qp_num = qpn;
		if (opc == ST_MLX5_CQE_REQ || opc == ST_MLX5_CQE_REQ_ERR) {
			uint8_t sop = (uint8_t)(be32toh(c->sop_drop_qpn) >> 24);
			w->opcode = send_op_to_wc(sop);
			if (qp && qp->sq_wrid) {
				uint32_t slot = ctr & (qp->sq_wqebb - 1);
				w->wr_id = qp->sq_wrid[slot];
				qp->sq_tail = qp->sq_next[slot];
			}
			if (opc == ST_MLX5_CQE_REQ) {
				w->status = IBV_WC_SUCCESS;
				w->byte_len = be32toh(c->byte_cnt);
			} else {
				const struct st_mlx5_err_cqe *e = (const void *)c;
				w->status = syndrome_to_status(e->syndrome);
				w->vendor_err = e->vendor_err_synd;
			}
		} else {
			int from_srq = qp && qp->srq;
			if (qp) {
				if (from_srq) {
					w->wr_id = qp->srq->wrid[ctr & (qp->srq->wqe_cnt - 1)];
					srq_wqe_free(qp->srq, ctr);
				} else if (qp->rq_wrid) {
					w->wr_id = qp->rq_wrid[ctr & (qp->rq_wqe_cnt - 1)];
					qp->rq_tail++;
				}
			}
			w->opcode = IBV_WC_RECV;
			if (opc == ST_MLX5_CQE_RESP_ERR) {
				const struct st_mlx5_err_cqe *e = (const void *)c;
				w->status = syndrome_to_status(e->syndrome);
				w->vendor_err = e->vendor_err_synd;
			} else {
				w->status = IBV_WC_SUCCESS;
				w->byte_len = be32toh(c->byte_cnt);
				w->src_qp = be32toh(c->flags_rqpn) & 0xffffff;
				w->slid = be16toh(c->slid);
				w->sl = (be32toh(c->flags_rqpn) >> 24) & 0xf;
				if ((be32toh(c->flags_rqpn) >> 28) & 3)
					w->wc_flags |= IBV_WC_GRH;
				if (opc == ST_MLX5_CQE_RESP_WR_IMM) {
					w->opcode = IBV_WC_RECV_RDMA_WITH_IMM;
					w->wc_flags |= IBV_WC_WITH_IMM;
					w->imm_data = c->imm_inval_pkey;
				} else if (opc == ST_MLX5_CQE_RESP_SEND_IMM) {
					w->wc_flags |= IBV_WC_WITH_IMM;
					w->imm_data = c->imm_inval_pkey;
				} else if (opc == ST_MLX5_CQE_RESP_SEND_INV) {
					w->wc_flags |= IBV_WC_WITH_INV;
					w->invalidated_rkey = be32toh(c->imm_inval_pkey);
				}
			}
		}
		cq->ci++;
		got++;
	}
	if (got)
		__atomic_store_n(&cq->dbrec[ST_MLX5_CQ_SET_CI], htobe32(cq->ci & 0xffffff), __ATOMIC_RELAXED);
	pthread_spin_unlock(&cq->poll_lock);
	if (!got)
		sched_yield(); /* 2-core friendliness: let the NIC thread run */
	return got;
}

/* ibv_destroy_qp, and a QP's move to RESET, take the QP's completions not yet
 * polled out of its CQ, as rdma-core's mlx5 provider does (__mlx5_cq_clean,
 * once the kernel has stopped the QP): the CQEs behind them move up, the
 * consumer index passes the gap, and an SRQ gets the receive WQEs back.  A CQE
 * left behind would name a QP that is gone; ibv_poll_cq would give it wr_id 0
 * (the QP's wr_id table is freed with it), and libfabric's verbs provider,
 * flushing its CQ when it closes an endpoint (vrb_cleanup_cq), takes wr_id as
 * its context pointer.  A CQ the application polls itself (mlx5dv_init_obj,
 * DevX) is left as it is, as rdma-core does (MLX5_CQ_FLAGS_DV_OWNED): its
 * consumer index is the application's.  The caller holds the NIC lock, so no
 * CQE of this QP comes after. */
EXPORT void emu_cq_clean(struct emu_cq *cq, uint32_t qpn, struct emu_srq *srq)
{
	if (!cq || cq->dv_owned || cq->devx || cq->collapsed)
		return;
	pthread_spin_lock(&cq->poll_lock);
	pthread_mutex_lock(&cq->lock);
	uint32_t ci = cq->ci, pending = 0;
	while (pending < cq->ncqe && ci + pending != cq->pi) {
		uint8_t op_own = emu_cqe_at(cq, ci + pending)->op_own;
		if ((op_own >> 4) == ST_MLX5_CQE_INVALID || (op_own & 1) != !!((ci + pending) & cq->ncqe))
			break;
		pending++;
	}
	uint32_t freed = 0;
	for (uint32_t k = pending; k-- > 0;) {
		struct st_mlx5_cqe64 *c = emu_cqe_at(cq, ci + k);
		uint8_t opc = c->op_own >> 4;
		if ((be32toh(c->sop_drop_qpn) & 0xffffff) == qpn) {
			if (srq && opc != ST_MLX5_CQE_REQ && opc != ST_MLX5_CQE_REQ_ERR)
				srq_wqe_free(srq, be16toh(c->wqe_counter));
			freed++;
		} else if (freed) {
			/* the slot keeps its own owner bit: the one its index is valid with */
			struct st_mlx5_cqe64 *d = emu_cqe_at(cq, ci + k + freed);
			uint8_t own = d->op_own & 1;
			memcpy((uint8_t *)d + 64 - cq->cqe_size, (uint8_t *)c + 64 - cq->cqe_size, cq->cqe_size);
			d->op_own = (uint8_t)((d->op_own & ~1) | own);
		}
	}
	if (freed) {
		cq->ci = ci + freed;
		__atomic_store_n(&cq->dbrec[ST_MLX5_CQ_SET_CI], htobe32(cq->ci & 0xffffff), __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&cq->lock);
	pthread_spin_unlock(&cq->poll_lock);
}

/* ---- ibv_cq_ex lazy polling (CQs from mlx5dv_create_cq) ------------------- */
static inline struct emu_cq *xcq(struct ibv_cq_ex *c) { return (struct emu_cq *)c; }

static int x_next_poll(struct ibv_cq_ex *c)
{
	struct emu_cq *cq = xcq(c);
	if (emu_poll_cq(&cq->cq, 1, &cq->xwc) != 1)
		return ENOENT;
	c->wr_id = cq->xwc.wr_id;
	c->status = cq->xwc.status;
	return 0;
}
static int x_start_poll(struct ibv_cq_ex *c, struct ibv_poll_cq_attr *attr)
{
	(void)attr;
	return x_next_poll(c);
}
static void x_end_poll(struct ibv_cq_ex *c) { (void)c; }
static enum ibv_wc_opcode x_read_opcode(struct ibv_cq_ex *c) { return xcq(c)->xwc.opcode; }
static uint32_t x_read_vendor_err(struct ibv_cq_ex *c) { return xcq(c)->xwc.vendor_err; }
static uint32_t x_read_byte_len(struct ibv_cq_ex *c) { return xcq(c)->xwc.byte_len; }
static __be32 x_read_imm_data(struct ibv_cq_ex *c) { return xcq(c)->xwc.imm_data; }
static uint32_t x_read_qp_num(struct ibv_cq_ex *c) { return xcq(c)->xwc.qp_num; }
static uint32_t x_read_src_qp(struct ibv_cq_ex *c) { return xcq(c)->xwc.src_qp; }
static unsigned int x_read_wc_flags(struct ibv_cq_ex *c) { return xcq(c)->xwc.wc_flags; }
static uint32_t x_read_slid(struct ibv_cq_ex *c) { return xcq(c)->xwc.slid; }
static uint8_t x_read_sl(struct ibv_cq_ex *c) { return xcq(c)->xwc.sl; }
static uint8_t x_read_dlid_path_bits(struct ibv_cq_ex *c) { return xcq(c)->xwc.dlid_path_bits; }
static uint64_t x_read_zero64(struct ibv_cq_ex *c) { (void)c; return 0; }
static uint16_t x_read_cvlan(struct ibv_cq_ex *c) { (void)c; return 0; }
static uint32_t x_read_flow_tag(struct ibv_cq_ex *c) { (void)c; return 0; }
static void x_read_tm_info(struct ibv_cq_ex *c, struct ibv_wc_tm_info *t) { (void)c; memset(t, 0, sizeof *t); }

EXPORT void emu_cq_init_ex_ops(struct emu_cq *cq)
{
	struct ibv_cq_ex *x = &cq->cqx;
	x->comp_mask = 0;
	x->start_poll = x_start_poll;
	x->next_poll = x_next_poll;
	x->end_poll = x_end_poll;
	x->read_opcode = x_read_opcode;
	x->read_vendor_err = x_read_vendor_err;
	x->read_byte_len = x_read_byte_len;
	x->read_imm_data = x_read_imm_data;
	x->read_qp_num = x_read_qp_num;
	x->read_src_qp = x_read_src_qp;
	x->read_wc_flags = x_read_wc_flags;
	x->read_slid = x_read_slid;
	x->read_sl = x_read_sl;
	x->read_dlid_path_bits = x_read_dlid_path_bits;
	x->read_completion_ts = x_read_zero64;
	x->read_cvlan = x_read_cvlan;
	x->read_flow_tag = x_read_flow_tag;
	x->read_tm_info = x_read_tm_info;
	x->read_completion_wallclock_ns = x_read_zero64;
}

/* The page of a context's CQ arm doorbells (mlx5dv_cq.cq_uar): one per
 * context, allocated on the first mlx5dv_init_obj(CQ); the NIC samples its
 * word at 0x20 (doorbell.c). */
EXPORT void *emu_ctx_cq_uar(struct ibv_context *c)
{
	struct emu_context *e = to_ectx(c);
	struct emu_nic *nic = e->nic;
	pthread_mutex_lock(&nic->lock);
	if (!e->cq_uar) {
		e->cq_uar = emu_uar_alloc(nic, 0);
		if (e->cq_uar) {
			e->cq_uar->cq_page = 1;
			__atomic_fetch_add(&nic->have_devx_uars, 1, __ATOMIC_RELAXED); /* no kick comes with an arm: poll */
		}
	}
	pthread_mutex_unlock(&nic->lock);
	emu_nic_kick(nic);
	return e->cq_uar ? e->cq_uar->page : NULL;
}
