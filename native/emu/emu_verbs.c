/* libibverbs.so.1 of the emulated HCA: the verbs API.  Posting writes real
 * mlx5 WQEs + DBR + 8-byte UAR doorbell (ref §1, §3); polling reads real
 * mlx5 CQEs (ref §2.2). */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "emu_internal.h"

static struct ibv_device g_dev;
static int g_dev_ready;
static struct emu_srq *g_srqs[256];

static void dev_init(void)
{
	if (g_dev_ready)
		return;
	memset(&g_dev, 0, sizeof g_dev);
	emu_identity(g_dev.name, sizeof g_dev.name, NULL, NULL, NULL);
	g_dev.node_type = IBV_NODE_CA;
	g_dev.transport_type = IBV_TRANSPORT_IB;
	snprintf(g_dev.dev_name, sizeof g_dev.dev_name, "uverbs0");
	snprintf(g_dev.dev_path, sizeof g_dev.dev_path, "/sys/class/infiniband_verbs/uverbs0");
	snprintf(g_dev.ibdev_path, sizeof g_dev.ibdev_path, "/sys/class/infiniband/%s", g_dev.name);
	g_dev_ready = 1;
}

static inline struct emu_context *to_ectx(struct ibv_context *c)
{
	return (struct emu_context *)((char *)c - offsetof(struct emu_context, vctx.context));
}
static inline struct emu_qp *to_eqp(struct ibv_qp *q) { return (struct emu_qp *)q; }
static inline struct emu_cq *to_ecq(struct ibv_cq *c) { return (struct emu_cq *)c; }

static uint32_t roundup_pow2(uint32_t v)
{
	uint32_t r = 1;
	while (r < v)
		r <<= 1;
	return r;
}

/* ---- devices ---------------------------------------------------------------- */
EXPORT struct ibv_device **ibv_get_device_list(int *num)
{
	dev_init();
	struct ibv_device **l = calloc(2, sizeof *l);
	if (!l) {
		errno = ENOMEM;
		return NULL;
	}
	l[0] = &g_dev;
	if (num)
		*num = 1;
	return l;
}

EXPORT void ibv_free_device_list(struct ibv_device **list) { free(list); }
EXPORT const char *ibv_get_device_name(struct ibv_device *d) { return d->name; }
EXPORT __be64 ibv_get_device_guid(struct ibv_device *d)
{
	uint64_t guid;
	emu_identity(NULL, 0, &guid, NULL, NULL);
	return htobe64(guid);
}
EXPORT int ibv_get_device_index(struct ibv_device *d) { return 0; }

/* ---- context --------------------------------------------------------------- */
static int emu_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
static int emu_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
static int emu_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
static int emu_req_notify_cq(struct ibv_cq *cq, int sol);
static int emu_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
static int emu_query_port_op(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a, size_t len);
static int emu_query_device_ex(struct ibv_context *c, const struct ibv_query_device_ex_input *in,
			       struct ibv_device_attr_ex *attr, size_t sz);
static struct ibv_qp *emu_create_qp_ex(struct ibv_context *c, struct ibv_qp_init_attr_ex *a);
static struct ibv_srq *emu_create_srq_ex(struct ibv_context *c, struct ibv_srq_init_attr_ex *a);

EXPORT struct ibv_context *ibv_open_device(struct ibv_device *dev)
{
	struct emu_context *e = calloc(1, sizeof *e);
	if (!e) {
		errno = ENOMEM;
		return NULL;
	}
	e->nic = emu_nic_get();
	if (!e->nic) {
		free(e);
		errno = ENODEV;
		return NULL;
	}
	struct ibv_context *c = &e->vctx.context;
	c->device = dev;
	c->ops.post_send = emu_post_send;
	c->ops.post_recv = emu_post_recv;
	c->ops.poll_cq = emu_poll_cq;
	c->ops.req_notify_cq = emu_req_notify_cq;
	c->ops.post_srq_recv = emu_post_srq_recv;
	c->cmd_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
	int p[2];
	if (pipe2(p, O_CLOEXEC) == 0) {
		c->async_fd = p[0];
		close(p[1]);
	} else {
		c->async_fd = -1;
	}
	c->num_comp_vectors = 1;
	pthread_mutex_init(&c->mutex, NULL);
	c->abi_compat = __VERBS_ABI_IS_EXTENDED;
	e->vctx.sz = sizeof(struct verbs_context);
	e->vctx.query_port = emu_query_port_op;
	e->vctx.query_device_ex = emu_query_device_ex;
	e->vctx.create_qp_ex = emu_create_qp_ex;
	e->vctx.create_srq_ex = emu_create_srq_ex;
	return c;
}

EXPORT int ibv_close_device(struct ibv_context *c)
{
	struct emu_context *e = to_ectx(c);
	if (c->cmd_fd >= 0)
		close(c->cmd_fd);
	if (c->async_fd >= 0)
		close(c->async_fd);
	emu_nic_put(e->nic);
	free(e);
	return 0;
}

/* exported for libmlx5.so.1 (mlx5dv_open_device) */
EXPORT struct emu_nic *emu_ctx_nic(struct ibv_context *c) { return to_ectx(c)->nic; }

EXPORT int ibv_query_device(struct ibv_context *c, struct ibv_device_attr *a)
{
	uint64_t guid;
	emu_identity(NULL, 0, &guid, NULL, NULL);
	memset(a, 0, sizeof *a);
	snprintf(a->fw_ver, sizeof a->fw_ver, "16.99.9999 (sigmatrace-emu)");
	a->node_guid = htobe64(guid);
	a->sys_image_guid = htobe64(guid);
	a->max_mr_size = 1ull << 40;
	a->page_size_cap = 0xfffff000;
	a->vendor_id = 0x02c9;
	a->vendor_part_id = 4123;
	a->hw_ver = 0;
	a->max_qp = EMU_MAX_QP;
	a->max_qp_wr = 32768;
	a->device_cap_flags = IBV_DEVICE_PORT_ACTIVE_EVENT | IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_CHANGE_PHY_PORT |
			      IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_SRQ_RESIZE;
	a->max_sge = EMU_MAX_SGE - 2;
	a->max_sge_rd = EMU_MAX_SGE - 2;
	a->max_cq = EMU_MAX_CQ - 1;
	a->max_cqe = 4194303;
	a->max_mr = EMU_MAX_MR - 1;
	a->max_pd = 1 << 20;
	a->max_qp_rd_atom = 16;
	a->max_ee_rd_atom = 0;
	a->max_res_rd_atom = 16 * EMU_MAX_QP;
	a->max_qp_init_rd_atom = 16;
	a->atomic_cap = IBV_ATOMIC_HCA;
	a->max_srq = 255;
	a->max_srq_wr = 32767;
	a->max_srq_sge = EMU_MAX_SGE - 2;
	a->max_pkeys = 1;
	a->local_ca_ack_delay = 16;
	a->phys_port_cnt = 1;
	return 0;
}

static int emu_query_device_ex(struct ibv_context *c, const struct ibv_query_device_ex_input *in,
			       struct ibv_device_attr_ex *attr, size_t sz)
{
	struct ibv_device_attr_ex tmp;
	memset(&tmp, 0, sizeof tmp);
	ibv_query_device(c, &tmp.orig_attr);
	tmp.max_dm_size = 0;
	memcpy(attr, &tmp, sz < sizeof tmp ? sz : sizeof tmp);
	return 0;
}

static void fill_port(struct ibv_port_attr *a)
{
	uint32_t lid;
	emu_identity(NULL, 0, NULL, &lid, NULL);
	memset(a, 0, sizeof *a);
	a->state = IBV_PORT_ACTIVE;
	a->max_mtu = IBV_MTU_4096;
	a->active_mtu = IBV_MTU_4096;
	a->gid_tbl_len = 1;
	a->port_cap_flags = 0x02514868;
	a->max_msg_sz = 1u << 30;
	a->pkey_tbl_len = 1;
	a->lid = (uint16_t)lid;
	a->sm_lid = 1;
	a->lmc = 0;
	a->max_vl_num = 4;
	a->sm_sl = 0;
	a->subnet_timeout = 18;
	a->active_width = 2;   /* 4X */
	a->active_speed = 32;  /* EDR */
	a->phys_state = 5;     /* LinkUp */
	a->link_layer = IBV_LINK_LAYER_INFINIBAND;
}

static int emu_query_port_op(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a, size_t len)
{
	if (port != 1)
		return EINVAL;
	struct ibv_port_attr tmp;
	fill_port(&tmp);
	memcpy(a, &tmp, len < sizeof tmp ? len : sizeof tmp);
	return 0;
}

#undef ibv_query_port
EXPORT int ibv_query_port(struct ibv_context *c, uint8_t port, struct _compat_ibv_port_attr *a)
{
	if (port != 1)
		return EINVAL;
	struct ibv_port_attr tmp;
	fill_port(&tmp);
	memcpy(a, &tmp, offsetof(struct ibv_port_attr, port_cap_flags2));
	return 0;
}

EXPORT int ibv_query_gid(struct ibv_context *c, uint8_t port, int index, union ibv_gid *gid)
{
	if (port != 1 || index != 0) {
		errno = EINVAL;
		return -1;
	}
	emu_identity(NULL, 0, NULL, NULL, gid->raw);
	return 0;
}

EXPORT int _ibv_query_gid_ex(struct ibv_context *c, uint32_t port, uint32_t index, struct ibv_gid_entry *entry,
			     uint32_t flags, size_t entry_size)
{
	if (port != 1 || index != 0)
		return EINVAL;
	struct ibv_gid_entry e;
	memset(&e, 0, sizeof e);
	emu_identity(NULL, 0, NULL, NULL, e.gid.raw);
	e.gid_index = 0;
	e.port_num = 1;
	e.gid_type = IBV_GID_TYPE_IB;
	memcpy(entry, &e, entry_size < sizeof e ? entry_size : sizeof e);
	return 0;
}

EXPORT ssize_t _ibv_query_gid_table(struct ibv_context *c, struct ibv_gid_entry *entries, size_t max,
				    uint32_t flags, size_t entry_size)
{
	if (max < 1)
		return -EINVAL;
	int r = _ibv_query_gid_ex(c, 1, 0, entries, 0, entry_size);
	return r ? -r : 1;
}

EXPORT int ibv_query_gid_type(struct ibv_context *c, uint8_t port, unsigned int index, int *type)
{
	if (port != 1 || index != 0)
		return -1;
	*type = 0; /* IBV_GID_TYPE_SYSFS_IB_ROCE_V1 / IB */
	return 0;
}

EXPORT int ibv_query_pkey(struct ibv_context *c, uint8_t port, int index, __be16 *pkey)
{
	if (port != 1 || index != 0) {
		errno = EINVAL;
		return -1;
	}
	*pkey = htobe16(0xffff);
	return 0;
}

EXPORT int ibv_get_pkey_index(struct ibv_context *c, uint8_t port, __be16 pkey)
{
	return (be16toh(pkey) & 0x7fff) == 0x7fff ? 0 : -1;
}

/* ---- PD / MR ------------------------------------------------------------- */
EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *c)
{
	struct emu_pd *p = calloc(1, sizeof *p);
	if (!p) {
		errno = ENOMEM;
		return NULL;
	}
	struct emu_nic *nic = to_ectx(c)->nic;
	pthread_mutex_lock(&nic->lock);
	p->pdn = nic->next_pdn++;
	pthread_mutex_unlock(&nic->lock);
	p->pd.context = c;
	p->pd.handle = p->pdn;
	return &p->pd;
}

EXPORT int ibv_dealloc_pd(struct ibv_pd *pd)
{
	free(pd);
	return 0;
}

EXPORT uint32_t emu_pd_num(struct ibv_pd *pd) { return ((struct emu_pd *)pd)->pdn; }

static struct ibv_mr *reg_mr_common(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access)
{
	if (((access & IBV_ACCESS_REMOTE_WRITE) || (access & IBV_ACCESS_REMOTE_ATOMIC)) &&
	    !(access & IBV_ACCESS_LOCAL_WRITE)) {
		errno = EINVAL;
		return NULL;
	}
	if (iova != (uint64_t)(uintptr_t)addr) {
		errno = EOPNOTSUPP; /* the emulator uses VA == IOVA */
		return NULL;
	}
	struct emu_nic *nic = to_ectx(pd->context)->nic;
	struct emu_mr *m = calloc(1, sizeof *m);
	if (!m) {
		errno = ENOMEM;
		return NULL;
	}
	static uint8_t keytag;
	pthread_mutex_lock(&nic->lock);
	uint32_t idx;
	for (idx = 1; idx < EMU_MAX_MR && nic->mrs[idx]; idx++)
		;
	if (idx == EMU_MAX_MR) {
		pthread_mutex_unlock(&nic->lock);
		free(m);
		errno = ENOMEM;
		return NULL;
	}
	m->addr = (uint64_t)(uintptr_t)addr;
	m->len = len;
	m->access = access;
	m->pdn = ((struct emu_pd *)pd)->pdn;
	m->mr.context = pd->context;
	m->mr.pd = pd;
	m->mr.addr = addr;
	m->mr.length = len;
	m->mr.handle = idx;
	m->mr.lkey = m->mr.rkey = (idx << 8) | (++keytag);
	m->valid = 1;
	nic->mrs[idx] = m;
	pthread_mutex_unlock(&nic->lock);
	return &m->mr;
}

#undef ibv_reg_mr
EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
	return reg_mr_common(pd, addr, len, (uintptr_t)addr, access);
}
#undef ibv_reg_mr_iova
EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access)
{
	return reg_mr_common(pd, addr, len, iova, access);
}
EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, unsigned int access)
{
	return reg_mr_common(pd, addr, len, iova, (int)access);
}

EXPORT int ibv_dereg_mr(struct ibv_mr *mr)
{
	struct emu_mr *m = (struct emu_mr *)mr;
	struct emu_nic *nic = to_ectx(mr->context)->nic;
	pthread_mutex_lock(&nic->lock);
	if (mr->handle < EMU_MAX_MR && nic->mrs[mr->handle] == m)
		nic->mrs[mr->handle] = NULL;
	m->valid = 0;
	pthread_mutex_unlock(&nic->lock);
	free(m);
	return 0;
}

EXPORT int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t len, int access)
{
	errno = EOPNOTSUPP;
	return IBV_REREG_MR_ERR_INPUT;
}

/* ---- completion channels and CQs ---------------------------------------- */
EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *c)
{
	struct emu_channel *ch = calloc(1, sizeof *ch);
	if (!ch) {
		errno = ENOMEM;
		return NULL;
	}
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

EXPORT struct emu_cq *emu_cq_new(struct emu_nic *nic, struct ibv_context *c, uint32_t ncqe, void *buf,
				 volatile uint32_t *dbrec, int devx)
{
	struct emu_cq *cq = calloc(1, sizeof *cq);
	if (!cq)
		return NULL;
	cq->ncqe = ncqe;
	cq->devx = devx;
	if (buf) {
		cq->buf = buf;
	} else {
		cq->buf = aligned_alloc(4096, ((size_t)ncqe * 64 + 4095) & ~(size_t)4095);
		if (!cq->buf) {
			free(cq);
			return NULL;
		}
		for (uint32_t i = 0; i < ncqe; i++) {
			memset(cq->buf + i * 64, 0, 64);
			cq->buf[i * 64 + 63] = (ST_MLX5_CQE_INVALID << 4) | 1;
		}
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

EXPORT void emu_cq_free(struct emu_nic *nic, struct emu_cq *cq)
{
	pthread_mutex_lock(&nic->lock);
	if (cq->cqn < EMU_MAX_CQ && nic->cqs[cq->cqn] == cq)
		nic->cqs[cq->cqn] = NULL;
	pthread_mutex_unlock(&nic->lock);
	if (cq->own_buf)
		free(cq->buf);
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

static int emu_req_notify_cq(struct ibv_cq *ibcq, int sol)
{
	struct emu_cq *cq = to_ecq(ibcq);
	pthread_mutex_lock(&cq->lock);
	cq->armed = 1;
	cq->arm_sol = sol;
	/* arm doorbell record (ref §2.2): sn<<28 | cmd | ci */
	cq->dbrec[ST_MLX5_CQ_ARM_DB] = htobe32(((cq->events & 3) << 28) |
					       (sol ? ST_MLX5_CQ_DB_REQ_NOT_SOL : ST_MLX5_CQ_DB_REQ_NOT) |
					       (cq->ci & 0xffffff));
	pthread_mutex_unlock(&cq->lock);
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

static int emu_poll_cq(struct ibv_cq *ibcq, int n, struct ibv_wc *wc)
{
	struct emu_cq *cq = to_ecq(ibcq);
	struct emu_nic *nic = to_ectx(ibcq->context)->nic;
	int got = 0;
	pthread_spin_lock(&cq->poll_lock);
	while (got < n) {
		const struct st_mlx5_cqe64 *c = (const void *)(cq->buf + (size_t)(cq->ci & (cq->ncqe - 1)) * 64);
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
		cq->dbrec[ST_MLX5_CQ_SET_CI] = htobe32(cq->ci & 0xffffff);
	pthread_spin_unlock(&cq->poll_lock);
	if (!got)
		sched_yield(); /* 2-core friendliness: let the NIC thread run */
	return got;
}

/* ---- QPs ------------------------------------------------------------------ */
static void qp_ring_doorbell(struct emu_qp *qp, struct st_mlx5_wqe_ctrl_seg *last)
{
	/* ref §3.4 ordering: WQEs -> barrier -> DBR -> barrier -> 8-byte DB */
	__atomic_thread_fence(__ATOMIC_RELEASE);
	qp->dbrec[ST_MLX5_SND_DBR] = htobe32(qp->sq_pi & 0xffff);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	uint64_t v;
	memcpy(&v, last, 8);
	__atomic_store_n((uint64_t *)(qp->uar + qp->bf_off), v, __ATOMIC_RELEASE);
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

static int emu_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
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
			ds = 1 + (is_rdma ? 1 : 0) + (inl ? st_mlx5_inline_ds(inl) : 0);
		} else {
			int nsg = 0;
			for (int i = 0; i < wr->num_sge; i++)
				nsg += wr->sg_list[i].length ? 1 : 0;
			if (is_atomic)
				nsg = 1;
			ds = 1 + ((is_rdma || is_atomic) ? 1 : 0) + (is_atomic ? 1 : 0) + (uint32_t)nsg;
		}
		uint32_t nbb = st_mlx5_wqebbs(ds);
		if (qp->sq_pi + nbb - qp->sq_tail > qp->sq_wqebb) {
			err = ENOMEM;
			break;
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

static int emu_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct emu_qp *qp = to_eqp(ibqp);
	int err = 0, n = 0;
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
	for (; wr; wr = wr->next) {
		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->rq_max_sge) {
			err = EINVAL;
			break;
		}
		if (qp->rq_pi - qp->rq_tail >= qp->rq_wqe_cnt) {
			err = ENOMEM;
			break;
		}
		uint32_t slot = qp->rq_pi & (qp->rq_wqe_cnt - 1);
		write_recv_wqe(qp->rq_buf + (size_t)slot * qp->rq_stride, qp->rq_stride, wr);
		qp->rq_wrid[slot] = wr->wr_id;
		qp->rq_pi++;
		n++;
	}
	if (n) {
		__atomic_thread_fence(__ATOMIC_RELEASE);
		qp->dbrec[ST_MLX5_RCV_DBR] = htobe32(qp->rq_pi & 0xffff);
		emu_nic_kick(qp->nic);
	}
	if (err)
		*bad = wr;
	pthread_spin_unlock(&qp->rq_lock);
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
static void x_set_ud_addr(struct ibv_qp_ex *q, struct ibv_ah *ah, uint32_t rqpn, uint32_t qkey) { x_unsupported(q); }
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

static struct ibv_qp *create_qp_common(struct ibv_context *c, struct ibv_pd *pd, struct ibv_qp_init_attr *ia,
				       uint64_t send_ops)
{
	struct emu_nic *nic = to_ectx(c)->nic;
	if (ia->qp_type != IBV_QPT_RC && ia->qp_type != IBV_QPT_UC) {
		errno = EOPNOTSUPP; /* UD/XRC/RAW are not emulated */
		return NULL;
	}
	if (!ia->send_cq || (!ia->recv_cq && !ia->srq) || ia->cap.max_send_wr > 16384 || ia->cap.max_recv_wr > 32768 ||
	    ia->cap.max_send_sge > EMU_MAX_SGE - 2 || ia->cap.max_recv_sge > EMU_MAX_SGE - 2 ||
	    ia->cap.max_inline_data > EMU_MAX_INLINE) {
		errno = EINVAL;
		return NULL;
	}
	struct emu_qp *qp = calloc(1, sizeof *qp);
	if (!qp) {
		errno = ENOMEM;
		return NULL;
	}
	/* send WQE size: ctrl + raddr + max(sges, inline, atomic) (ref §1) */
	uint32_t sge_bytes = 32 + 16 * (ia->cap.max_send_sge ? ia->cap.max_send_sge : 1);
	uint32_t inl_bytes = 32 + ((4 + ia->cap.max_inline_data + 15) & ~15u);
	uint32_t wqe = sge_bytes > inl_bytes ? sge_bytes : inl_bytes;
	if (wqe < 64)
		wqe = 64;
	wqe = (wqe + 63) & ~63u;
	qp->sq_max_wqe_bb = wqe / 64;
	qp->max_inline = wqe - 32 - 4;
	if (qp->max_inline > EMU_MAX_INLINE)
		qp->max_inline = EMU_MAX_INLINE;
	qp->max_send_sge = (wqe - 32) / 16;
	if (qp->max_send_sge > EMU_MAX_SGE - 2)
		qp->max_send_sge = EMU_MAX_SGE - 2;
	uint32_t swr = ia->cap.max_send_wr ? ia->cap.max_send_wr : 1;
	qp->sq_wqebb = roundup_pow2(swr * qp->sq_max_wqe_bb);
	qp->max_send_wr = qp->sq_wqebb / qp->sq_max_wqe_bb;
	size_t rq_bytes = 0;
	if (!ia->srq) {
		uint32_t rsge = ia->cap.max_recv_sge ? ia->cap.max_recv_sge : 1;
		qp->rq_stride = roundup_pow2(rsge * 16);
		qp->rq_max_sge = qp->rq_stride / 16;
		qp->rq_wqe_cnt = roundup_pow2(ia->cap.max_recv_wr ? ia->cap.max_recv_wr : 1);
		qp->max_recv_wr = qp->rq_wqe_cnt;
		rq_bytes = (size_t)qp->rq_wqe_cnt * qp->rq_stride;
		rq_bytes = (rq_bytes + 63) & ~(size_t)63;
	}
	size_t sq_bytes = (size_t)qp->sq_wqebb * 64;
	qp->qp_buf = aligned_alloc(4096, (rq_bytes + sq_bytes + 4095) & ~(size_t)4095);
	qp->sq_wrid = calloc(qp->sq_wqebb, sizeof(uint64_t));
	qp->sq_next = calloc(qp->sq_wqebb, sizeof(uint32_t));
	qp->rq_wrid = qp->rq_wqe_cnt ? calloc(qp->rq_wqe_cnt, sizeof(uint64_t)) : NULL;
	qp->inflight = calloc(qp->sq_wqebb, sizeof(struct emu_inflight));
	if (!qp->qp_buf || !qp->sq_wrid || !qp->sq_next || !qp->inflight || (qp->rq_wqe_cnt && !qp->rq_wrid)) {
		free(qp->qp_buf); free(qp->sq_wrid); free(qp->sq_next); free(qp->rq_wrid); free(qp->inflight); free(qp);
		errno = ENOMEM;
		return NULL;
	}
	memset(qp->qp_buf, 0, rq_bytes + sq_bytes);
	qp->own_bufs = 1;
	qp->rq_buf = qp->qp_buf;            /* RQ at offset 0, SQ after it (ref §1.1) */
	qp->sq_buf = qp->qp_buf + rq_bytes;
	qp->if_cap = qp->sq_wqebb;
	qp->dbrec = (volatile uint32_t *)qp->dbr_storage;
	pthread_spin_init(&qp->sq_lock, PTHREAD_PROCESS_PRIVATE);
	pthread_spin_init(&qp->rq_lock, PTHREAD_PROCESS_PRIVATE);
	qp->scq = to_ecq(ia->send_cq);
	qp->rcq = ia->recv_cq ? to_ecq(ia->recv_cq) : NULL;
	qp->srq = ia->srq ? (struct emu_srq *)ia->srq : NULL;
	qp->sq_sig_all = ia->sq_sig_all;
	qp->state = IBV_QPS_RESET;
	pthread_mutex_lock(&nic->lock);
	qp->bf_off = ST_MLX5_BF_OFFSET;
	if (nic->bfreg_share) {
		/* a page shared like rdma-core's bfregs: polled (devx), with doorbell
		 * record recovery when two QPs' doorbells meet in one sample */
		if (!nic->shared_uar || (nic->bfreg_share == 1 && nic->shared_n == 2)) {
			nic->shared_uar = emu_uar_alloc(nic, 1);
			nic->shared_n = 0;
		} else {
			nic->shared_uar->refs++;
		}
		qp->uarobj = nic->shared_uar;
		if (nic->bfreg_share == 1)
			qp->bf_off += 0x200 * (uint32_t)nic->shared_n;
		nic->shared_n++;
	} else {
		qp->uarobj = emu_uar_alloc(nic, 0);
	}
	int r = qp->uarobj ? emu_qp_register(nic, qp) : -1;
	if (r && qp->uarobj && --qp->uarobj->refs == 0) { /* not registered: its share of the page goes */
		if (nic->shared_uar == qp->uarobj)
			nic->shared_uar = NULL;
		emu_uar_free(nic, qp->uarobj);
	}
	pthread_mutex_unlock(&nic->lock);
	if (r) {
		free(qp->qp_buf); free(qp->sq_wrid); free(qp->sq_next); free(qp->rq_wrid); free(qp->inflight); free(qp);
		errno = ENOMEM;
		return NULL;
	}
	qp->uar = qp->uarobj->page;
	struct ibv_qp *b = &qp->qpx.qp_base;
	b->context = c;
	b->qp_context = ia->qp_context;
	b->pd = pd;
	b->send_cq = ia->send_cq;
	b->recv_cq = ia->recv_cq;
	b->srq = ia->srq;
	b->handle = qp->qpn;
	b->qp_num = qp->qpn;
	b->state = IBV_QPS_RESET;
	b->qp_type = ia->qp_type;
	pthread_mutex_init(&b->mutex, NULL);
	pthread_cond_init(&b->cond, NULL);
	qp->qpx.comp_mask = 0;
	emu_qp_init_ex_ops(qp);
	ia->cap.max_send_wr = qp->max_send_wr;
	ia->cap.max_send_sge = qp->max_send_sge;
	ia->cap.max_inline_data = qp->max_inline;
	if (!ia->srq) {
		ia->cap.max_recv_wr = qp->max_recv_wr;
		ia->cap.max_recv_sge = qp->rq_max_sge;
	}
	EMU_LOG("create qp 0x%x sq %u WQEBBs (max wqe %u BB, inline %u) rq %u x %u B", qp->qpn, qp->sq_wqebb,
		qp->sq_max_wqe_bb, qp->max_inline, qp->rq_wqe_cnt, qp->rq_stride);
	return b;
}

EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *ia)
{
	return create_qp_common(pd->context, pd, ia, 0);
}

static struct ibv_qp *emu_create_qp_ex(struct ibv_context *c, struct ibv_qp_init_attr_ex *a)
{
	if (!(a->comp_mask & IBV_QP_INIT_ATTR_PD) || !a->pd) {
		errno = EINVAL;
		return NULL;
	}
	if (a->comp_mask & ~(uint32_t)(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof ia);
	ia.qp_context = a->qp_context;
	ia.send_cq = a->send_cq;
	ia.recv_cq = a->recv_cq;
	ia.srq = a->srq;
	ia.cap = a->cap;
	ia.qp_type = a->qp_type;
	ia.sq_sig_all = a->sq_sig_all;
	struct ibv_qp *q = create_qp_common(c, a->pd, &ia, a->send_ops_flags);
	if (q) {
		a->cap = ia.cap;
		if (a->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)
			to_eqp(q)->qpx.comp_mask = 0;
	}
	return q;
}

EXPORT int ibv_destroy_qp(struct ibv_qp *ibqp)
{
	struct emu_qp *qp = to_eqp(ibqp);
	struct emu_nic *nic = qp->nic;
	pthread_mutex_lock(&nic->lock);
	emu_qp_unregister(nic, qp);
	if (qp->uarobj && --qp->uarobj->refs == 0) {
		if (nic->shared_uar == qp->uarobj)
			nic->shared_uar = NULL;
		emu_uar_free(nic, qp->uarobj);
	}
	pthread_mutex_unlock(&nic->lock);
	if (qp->own_bufs)
		free(qp->qp_buf);
	free(qp->sq_wrid);
	free(qp->sq_next);
	free(qp->rq_wrid);
	free(qp->inflight);
	free(qp);
	return 0;
}

EXPORT const char *emu_state_name(int s)
{
	static const char *n[] = { "RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR" };
	return s >= 0 && s <= 6 ? n[s] : "?";
}

/* Valid transitions (IB spec QP state machine, as the kernel enforces). */
EXPORT int emu_qp_modify_state(struct emu_qp *qp, int cur, int nw)
{
	if (nw == IBV_QPS_RESET || nw == IBV_QPS_ERR)
		return 0;
	switch (cur) {
	case IBV_QPS_RESET: return nw == IBV_QPS_INIT ? 0 : EINVAL;
	case IBV_QPS_INIT: return (nw == IBV_QPS_INIT || nw == IBV_QPS_RTR) ? 0 : EINVAL;
	case IBV_QPS_RTR: return nw == IBV_QPS_RTS ? 0 : EINVAL;
	case IBV_QPS_RTS: return (nw == IBV_QPS_RTS || nw == IBV_QPS_SQD) ? 0 : EINVAL;
	case IBV_QPS_SQD: return (nw == IBV_QPS_RTS || nw == IBV_QPS_SQD) ? 0 : EINVAL;
	case IBV_QPS_SQE: return nw == IBV_QPS_RTS ? 0 : EINVAL;
	default: return EINVAL;
	}
}

EXPORT void emu_qp_apply_reset(struct emu_qp *qp)
{
	emu_qp_reset_nic_state(qp);
	qp->sq_pi = qp->sq_tail = 0;
	qp->rq_pi = qp->rq_tail = 0;
	if (qp->dbrec) {
		qp->dbrec[0] = 0;
		qp->dbrec[1] = 0;
	}
	if (qp->uarobj && !qp->uarobj->devx) {
		memset(qp->uar + ST_MLX5_BF_OFFSET, 0, 8);
		qp->uarobj->last[0] = 0;
	}
}

EXPORT int ibv_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask)
{
	struct emu_qp *qp = to_eqp(ibqp);
	struct emu_nic *nic = qp->nic;
	pthread_mutex_lock(&nic->lock);
	int cur = (mask & IBV_QP_CUR_STATE) ? (int)attr->cur_qp_state : qp->state;
	int nw = (mask & IBV_QP_STATE) ? (int)attr->qp_state : cur;
	int err = emu_qp_modify_state(qp, cur, nw);
	if (!err && (mask & IBV_QP_STATE)) {
		int rc = ibqp->qp_type == IBV_QPT_RC;
		int need = 0;
		if (cur == IBV_QPS_RESET && nw == IBV_QPS_INIT)
			need = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
		else if (cur == IBV_QPS_INIT && nw == IBV_QPS_RTR)
			need = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			       (rc ? IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER : 0);
		else if (cur == IBV_QPS_RTR && nw == IBV_QPS_RTS)
			need = IBV_QP_SQ_PSN | (rc ? IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
						     IBV_QP_MAX_QP_RD_ATOMIC : 0);
		if ((mask & need) != need)
			err = EINVAL;
	}
	if (!err && (mask & IBV_QP_PORT) && attr->port_num != 1)
		err = EINVAL;
	if (err) {
		EMU_LOG("modify qp 0x%x %s->%s rejected (mask 0x%x)", qp->qpn, emu_state_name(cur), emu_state_name(nw), mask);
		pthread_mutex_unlock(&nic->lock);
		return err;
	}
	if (mask & IBV_QP_ACCESS_FLAGS)
		qp->qp_access = attr->qp_access_flags;
	if (mask & IBV_QP_PORT)
		qp->port = attr->port_num;
	if (mask & IBV_QP_PATH_MTU)
		qp->mtu = attr->path_mtu;
	if (mask & IBV_QP_DEST_QPN)
		qp->dest_qpn = attr->dest_qp_num;
	if (mask & IBV_QP_RQ_PSN)
		qp->rq_psn = attr->rq_psn;
	if (mask & IBV_QP_SQ_PSN)
		qp->sq_psn = attr->sq_psn;
	if (mask & IBV_QP_TIMEOUT)
		qp->timeout = attr->timeout;
	if (mask & IBV_QP_RETRY_CNT)
		qp->retry_cnt = attr->retry_cnt;
	if (mask & IBV_QP_RNR_RETRY)
		qp->rnr_retry = attr->rnr_retry;
	if (mask & IBV_QP_MIN_RNR_TIMER)
		qp->min_rnr_timer = attr->min_rnr_timer;
	if (mask & IBV_QP_AV) {
		qp->dlid = attr->ah_attr.dlid;
		qp->is_global = attr->ah_attr.is_global;
		memcpy(qp->dgid, attr->ah_attr.grh.dgid.raw, 16);
		qp->peer = NULL;
	}
	if (mask & IBV_QP_STATE) {
		if (nw == IBV_QPS_RESET) {
			emu_qp_apply_reset(qp);
		} else if (nw == IBV_QPS_ERR) {
			emu_qp_to_error(qp);
		} else if (nw == IBV_QPS_RTR) {
			emu_resolve_peer(qp);
		}
		qp->state = nw;
		ibqp->state = (enum ibv_qp_state)nw;
		EMU_LOG("qp 0x%x -> %s (dest qpn 0x%x dlid %u)", qp->qpn, emu_state_name(nw), qp->dest_qpn, qp->dlid);
	}
	pthread_mutex_unlock(&nic->lock);
	emu_nic_kick(nic);
	return 0;
}

EXPORT int ibv_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask, struct ibv_qp_init_attr *init)
{
	struct emu_qp *qp = to_eqp(ibqp);
	memset(attr, 0, sizeof *attr);
	attr->qp_state = (enum ibv_qp_state)qp->state;
	attr->cur_qp_state = attr->qp_state;
	attr->path_mtu = (enum ibv_mtu)qp->mtu;
	attr->qp_access_flags = qp->qp_access;
	attr->dest_qp_num = qp->dest_qpn;
	attr->rq_psn = qp->rq_psn;
	attr->sq_psn = qp->sq_psn;
	attr->timeout = qp->timeout;
	attr->retry_cnt = qp->retry_cnt;
	attr->rnr_retry = qp->rnr_retry;
	attr->min_rnr_timer = qp->min_rnr_timer;
	attr->port_num = qp->port ? qp->port : 1;
	attr->ah_attr.dlid = (uint16_t)qp->dlid;
	attr->ah_attr.is_global = (uint8_t)qp->is_global;
	memcpy(attr->ah_attr.grh.dgid.raw, qp->dgid, 16);
	attr->ah_attr.port_num = attr->port_num;
	attr->max_rd_atomic = 16;
	attr->max_dest_rd_atomic = 16;
	attr->cap.max_send_wr = qp->max_send_wr;
	attr->cap.max_send_sge = qp->max_send_sge;
	attr->cap.max_inline_data = qp->max_inline;
	attr->cap.max_recv_wr = qp->max_recv_wr;
	attr->cap.max_recv_sge = qp->rq_max_sge;
	if (init) {
		memset(init, 0, sizeof *init);
		init->qp_context = ibqp->qp_context;
		init->send_cq = ibqp->send_cq;
		init->recv_cq = ibqp->recv_cq;
		init->srq = ibqp->srq;
		init->cap = attr->cap;
		init->qp_type = ibqp->qp_type;
		init->sq_sig_all = qp->sq_sig_all;
	}
	return 0;
}

EXPORT int ibv_query_qp_data_in_order(struct ibv_qp *qp, enum ibv_wr_opcode op, uint32_t flags) { return 0; }

/* ---- SRQ -------------------------------------------------------------------- */
static struct ibv_srq *srq_create(struct ibv_context *c, struct ibv_pd *pd, struct ibv_srq_init_attr *a)
{
	struct emu_nic *nic = to_ectx(c)->nic;
	if (a->attr.max_wr < 1 || a->attr.max_wr > 32767 || a->attr.max_sge > EMU_MAX_SGE - 2) {
		errno = EINVAL;
		return NULL;
	}
	struct emu_srq *s = calloc(1, sizeof *s);
	if (!s) {
		errno = ENOMEM;
		return NULL;
	}
	s->wqe_cnt = roundup_pow2(a->attr.max_wr + 1);
	s->stride = roundup_pow2((a->attr.max_sge ? a->attr.max_sge : 1) * 16);
	s->max_sge = s->stride / 16;
	s->buf = aligned_alloc(4096, ((size_t)s->wqe_cnt * s->stride + 4095) & ~(size_t)4095);
	s->wrid = calloc(s->wqe_cnt, sizeof(uint64_t));
	if (!s->buf || !s->wrid) {
		free(s->buf); free(s->wrid); free(s);
		errno = ENOMEM;
		return NULL;
	}
	s->dbrec = (volatile uint32_t *)s->dbr_storage;
	s->limit = a->attr.srq_limit;
	pthread_spin_init(&s->plock, PTHREAD_PROCESS_PRIVATE);
	pthread_mutex_lock(&nic->lock);
	uint32_t i;
	for (i = 1; i < 256 && g_srqs[i]; i++)
		;
	if (i == 256) {
		pthread_mutex_unlock(&nic->lock);
		free(s->buf); free(s->wrid); free(s);
		errno = ENOMEM;
		return NULL;
	}
	g_srqs[i] = s;
	s->srqn = i;
	pthread_mutex_unlock(&nic->lock);
	s->srq.context = c;
	s->srq.srq_context = a->srq_context;
	s->srq.pd = pd;
	s->srq.handle = i;
	pthread_mutex_init(&s->srq.mutex, NULL);
	pthread_cond_init(&s->srq.cond, NULL);
	a->attr.max_wr = s->wqe_cnt - 1;
	a->attr.max_sge = s->max_sge;
	return &s->srq;
}

EXPORT struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *a)
{
	return srq_create(pd->context, pd, a);
}

static struct ibv_srq *emu_create_srq_ex(struct ibv_context *c, struct ibv_srq_init_attr_ex *a)
{
	if (!(a->comp_mask & IBV_SRQ_INIT_ATTR_PD) || ((a->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) && a->srq_type != IBV_SRQT_BASIC)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	struct ibv_srq_init_attr ia = { .srq_context = a->srq_context, .attr = a->attr };
	struct ibv_srq *s = srq_create(c, a->pd, &ia);
	if (s)
		a->attr = ia.attr;
	return s;
}

EXPORT int ibv_destroy_srq(struct ibv_srq *srq)
{
	struct emu_srq *s = (struct emu_srq *)srq;
	struct emu_nic *nic = to_ectx(srq->context)->nic;
	pthread_mutex_lock(&nic->lock);
	g_srqs[s->srqn] = NULL;
	pthread_mutex_unlock(&nic->lock);
	free(s->buf);
	free(s->wrid);
	free(s);
	return 0;
}

EXPORT int ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr, int mask)
{
	struct emu_srq *s = (struct emu_srq *)srq;
	if (mask & IBV_SRQ_MAX_WR)
		return EINVAL;
	if (mask & IBV_SRQ_LIMIT)
		s->limit = attr->srq_limit;
	return 0;
}

EXPORT int ibv_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr)
{
	struct emu_srq *s = (struct emu_srq *)srq;
	attr->max_wr = s->wqe_cnt - 1;
	attr->max_sge = s->max_sge;
	attr->srq_limit = s->limit;
	return 0;
}

static int emu_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct emu_srq *s = (struct emu_srq *)srq;
	int err = 0, n = 0;
	pthread_spin_lock(&s->plock);
	for (; wr; wr = wr->next) {
		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > s->max_sge) {
			err = EINVAL;
			break;
		}
		if (s->pi - __atomic_load_n(&s->ci, __ATOMIC_ACQUIRE) >= s->wqe_cnt - 1) {
			err = ENOMEM;
			break;
		}
		uint32_t slot = s->pi & (s->wqe_cnt - 1);
		write_recv_wqe(s->buf + (size_t)slot * s->stride, s->stride, wr);
		s->wrid[slot] = wr->wr_id;
		s->pi++;
		n++;
	}
	if (n) {
		__atomic_thread_fence(__ATOMIC_RELEASE);
		s->dbrec[0] = htobe32(s->pi & 0xffff);
		emu_nic_kick(to_ectx(srq->context)->nic);
	}
	if (err)
		*bad = wr;
	pthread_spin_unlock(&s->plock);
	return err;
}

/* ---- async events ----------------------------------------------------------- */
EXPORT int ibv_get_async_event(struct ibv_context *c, struct ibv_async_event *ev)
{
	char b;
	/* no async events are generated; block like the real call until the fd closes */
	if (read(c->async_fd, &b, 1) <= 0)
		return -1;
	return -1;
}
EXPORT void ibv_ack_async_event(struct ibv_async_event *ev) {}

EXPORT struct emu_srq *emu_srq_lookup(uint32_t srqn) { return srqn < 256 ? g_srqs[srqn] : NULL; }
