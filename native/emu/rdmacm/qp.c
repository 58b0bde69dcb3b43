/* Emulated librdmacm: QPs, SRQs and endpoints on ids, and the QP attributes
 * the CM hands out (rdma_init_qp_attr), which drive the emulated QP through
 * INIT, RTR and RTS with the peer's QPN, PSN and LID learnt in the handshake.
 * A connected QP is moved to INIT when it is created, to RTR/RTS by
 * rdma_accept (passive) or when the CONNECT_RESPONSE is retrieved (active);
 * a UD QP goes straight to RTS with the well-known qkey. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cma.h"

int cma_qp_attr(struct cm_id *c, struct ibv_qp_attr *a, int *mask)
{
	enum ibv_qp_state st = a->qp_state;
	int connected = c->state == CS_REQ_RCVD || c->state == CS_REP_SENT || c->state == CS_REP_RCVD ||
			c->state == CS_ESTABLISHED;
	memset(a, 0, sizeof *a);
	a->qp_state = st;
	switch (st) {
	case IBV_QPS_INIT:
		a->pkey_index = 0;
		a->port_num = 1;
		*mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
		if (c->id.qp_type == IBV_QPT_UD) {
			a->qkey = RDMA_UDP_QKEY;
			*mask |= IBV_QP_QKEY;
		} else {
			/* before a connection: no remote access; after: what the CM grants */
			a->qp_access_flags = connected ? IBV_ACCESS_REMOTE_WRITE |
				(c->resp_res ? IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC : 0) : 0;
			*mask |= IBV_QP_ACCESS_FLAGS;
		}
		return 0;
	case IBV_QPS_RTR:
		if (c->id.qp_type == IBV_QPT_UD) {
			*mask = IBV_QP_STATE;
			return 0;
		}
		if (!connected)
			return cma_err(EINVAL);
		a->ah_attr.dlid = (uint16_t)c->peer.lid;
		a->ah_attr.port_num = 1;
		a->path_mtu = IBV_MTU_4096;
		a->dest_qp_num = c->remote_qpn;
		a->rq_psn = c->remote_psn;
		a->max_dest_rd_atomic = c->resp_res;
		a->min_rnr_timer = 0;
		*mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
		return 0;
	case IBV_QPS_RTS:
		a->sq_psn = c->id.qp_type == IBV_QPT_UD ? 0 : c->local_psn;
		*mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
		if (c->id.qp_type == IBV_QPT_UD)
			return 0;
		if (!connected)
			return cma_err(EINVAL);
		a->timeout = c->ack_timeout_set ? c->ack_timeout : (uint8_t)(c->path.packet_life_time + 1);
		a->retry_cnt = c->retry_count;
		/* active side: the RNR retries the passive side asked for in its REP;
		 * passive side: those of the REQ */
		a->rnr_retry = c->remote_rnr_retry;
		a->max_rd_atomic = c->init_depth;
		*mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
		return 0;
	default:
		return cma_err(EINVAL);
	}
}

CMA_EXPORT int rdma_init_qp_attr(struct rdma_cm_id *id, struct ibv_qp_attr *qp_attr, int *qp_attr_mask)
{
	if (!id || !qp_attr || !qp_attr_mask)
		return cma_err(EINVAL);
	pthread_mutex_lock(&cma.lock);
	int r = cma_qp_attr(to_cid(id), qp_attr, qp_attr_mask);
	pthread_mutex_unlock(&cma.lock);
	return r;
}

static int modify(struct cm_id *c, struct ibv_qp_attr *a, int mask)
{
	int r = ibv_modify_qp(c->id.qp, a, mask);
	if (r)
		CMA_LOG("qp 0x%x: modify to state %d failed: %s", c->id.qp->qp_num, a->qp_state, strerror(r));
	return r ? cma_err(r) : 0;
}

/* Lock held.  As librdmacm: INIT again (the access flags the CM grants), then RTR. */
int cma_modify_qp_rtr(struct cm_id *c, uint8_t resp_res)
{
	if (!c->id.qp)
		return 0;
	struct ibv_qp_attr a;
	int mask;
	a.qp_state = IBV_QPS_INIT;
	if (cma_qp_attr(c, &a, &mask) || modify(c, &a, mask))
		return -1;
	a.qp_state = IBV_QPS_RTR;
	if (cma_qp_attr(c, &a, &mask))
		return -1;
	if (resp_res != RDMA_MAX_RESP_RES)
		a.max_dest_rd_atomic = resp_res;
	CMA_LOG("qp 0x%x -> RTR: dest qpn 0x%x dlid %u rq_psn 0x%x", c->id.qp->qp_num, a.dest_qp_num, a.ah_attr.dlid,
		a.rq_psn);
	return modify(c, &a, mask);
}

int cma_modify_qp_rts(struct cm_id *c, uint8_t init_depth)
{
	if (!c->id.qp)
		return 0;
	struct ibv_qp_attr a;
	int mask;
	a.qp_state = IBV_QPS_RTS;
	if (cma_qp_attr(c, &a, &mask))
		return -1;
	if (init_depth != RDMA_MAX_INIT_DEPTH)
		a.max_rd_atomic = init_depth;
	return modify(c, &a, mask);
}

/* ---- CQs the library creates for a QP without them ------------------------------------- */
static void destroy_cqs(struct rdma_cm_id *id)
{
	if (id->recv_cq) {
		ibv_destroy_cq(id->recv_cq);
		if (id->send_cq && id->send_cq != id->recv_cq)
			ibv_destroy_cq(id->send_cq);
		id->recv_cq = id->send_cq = NULL;
	} else if (id->send_cq) {
		ibv_destroy_cq(id->send_cq);
		id->send_cq = NULL;
	}
	if (id->recv_cq_channel) {
		ibv_destroy_comp_channel(id->recv_cq_channel);
		if (id->send_cq_channel && id->send_cq_channel != id->recv_cq_channel)
			ibv_destroy_comp_channel(id->send_cq_channel);
		id->recv_cq_channel = id->send_cq_channel = NULL;
	} else if (id->send_cq_channel) {
		ibv_destroy_comp_channel(id->send_cq_channel);
		id->send_cq_channel = NULL;
	}
}

static int create_cqs(struct rdma_cm_id *id, uint32_t send_size, uint32_t recv_size)
{
	if (recv_size) {
		id->recv_cq_channel = ibv_create_comp_channel(id->verbs);
		id->recv_cq = id->recv_cq_channel ? ibv_create_cq(id->verbs, (int)recv_size, id, id->recv_cq_channel, 0)
						  : NULL;
		if (!id->recv_cq)
			goto err;
	}
	if (send_size) {
		id->send_cq_channel = ibv_create_comp_channel(id->verbs);
		id->send_cq = id->send_cq_channel ? ibv_create_cq(id->verbs, (int)send_size, id, id->send_cq_channel, 0)
						  : NULL;
		if (!id->send_cq)
			goto err;
	}
	return 0;
err:
	destroy_cqs(id);
	return -1;
}

CMA_EXPORT int rdma_create_qp_ex(struct rdma_cm_id *id, struct ibv_qp_init_attr_ex *attr)
{
	if (!id || !attr)
		return cma_err(EINVAL);
	if (id->qp || !id->verbs)
		return cma_err(EINVAL);
	if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd) {
		attr->comp_mask |= IBV_QP_INIT_ATTR_PD;
		attr->pd = id->pd;
	} else if (attr->pd->context != id->verbs) {
		return cma_err(EINVAL);
	}
	if ((id->recv_cq && attr->recv_cq && id->recv_cq != attr->recv_cq) ||
	    (id->send_cq && attr->send_cq && id->send_cq != attr->send_cq))
		return cma_err(EINVAL);
	if (create_cqs(id, attr->send_cq || id->send_cq ? 0 : attr->cap.max_send_wr,
		       attr->recv_cq || id->recv_cq ? 0 : attr->cap.max_recv_wr))
		return -1;
	if (!attr->send_cq)
		attr->send_cq = id->send_cq;
	if (!attr->recv_cq)
		attr->recv_cq = id->recv_cq;
	if (id->srq && !attr->srq)
		attr->srq = id->srq;
	struct ibv_qp *qp = ibv_create_qp_ex(id->verbs, attr);
	if (!qp) {
		int e = errno;
		destroy_cqs(id);
		return cma_err(e);
	}
	struct cm_id *c = to_cid(id);
	struct ibv_qp_attr a;
	int mask, r;
	pthread_mutex_lock(&cma.lock);
	id->qp = qp;   /* cma_qp_attr reads the id's QP type */
	a.qp_state = IBV_QPS_INIT;
	r = cma_qp_attr(c, &a, &mask) || modify(c, &a, mask);
	if (!r && id->qp_type == IBV_QPT_UD) {
		a.qp_state = IBV_QPS_RTR;
		r = cma_qp_attr(c, &a, &mask) || modify(c, &a, mask);
		a.qp_state = IBV_QPS_RTS;
		r = r || cma_qp_attr(c, &a, &mask) || modify(c, &a, mask);
	}
	if (r)
		id->qp = NULL;
	pthread_mutex_unlock(&cma.lock);
	if (r) {
		int e = errno;
		ibv_destroy_qp(qp);
		destroy_cqs(id);
		return cma_err(e);
	}
	id->pd = qp->pd;
	CMA_LOG("id %p: qp 0x%x created (type %d) and in INIT", (void *)id, qp->qp_num, qp->qp_type);
	return 0;
}

CMA_EXPORT int rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr)
{
	if (!id || !qp_init_attr)
		return cma_err(EINVAL);
	struct ibv_qp_init_attr_ex ax;
	memset(&ax, 0, sizeof ax);
	memcpy(&ax, qp_init_attr, sizeof *qp_init_attr);
	ax.comp_mask = IBV_QP_INIT_ATTR_PD;
	ax.pd = pd ? pd : id->pd;
	int r = rdma_create_qp_ex(id, &ax);
	memcpy(qp_init_attr, &ax, sizeof *qp_init_attr);
	return r;
}

CMA_EXPORT void rdma_destroy_qp(struct rdma_cm_id *id)
{
	if (!id || !id->qp)
		return;
	ibv_destroy_qp(id->qp);
	id->qp = NULL;
	destroy_cqs(id);
}

CMA_EXPORT int rdma_create_srq_ex(struct rdma_cm_id *id, struct ibv_srq_init_attr_ex *attr)
{
	if (!id || !attr || !id->verbs || !(attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE))
		return cma_err(EINVAL);
	if (attr->srq_type != IBV_SRQT_BASIC)
		return cma_err(EOPNOTSUPP);   /* XRC is not emulated */
	struct ibv_pd *pd = (attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) && attr->pd ? attr->pd : id->pd;
	struct ibv_srq_init_attr sa = { .srq_context = attr->srq_context, .attr = attr->attr };
	struct ibv_srq *srq = ibv_create_srq(pd, &sa);
	if (!srq)
		return -1;
	attr->attr = sa.attr;
	attr->pd = pd;
	attr->comp_mask |= IBV_SRQ_INIT_ATTR_PD;
	if (!id->pd)
		id->pd = pd;
	id->srq = srq;
	return 0;
}

CMA_EXPORT int rdma_create_srq(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
	if (!attr)
		return cma_err(EINVAL);
	struct ibv_srq_init_attr_ex ax;
	memset(&ax, 0, sizeof ax);
	memcpy(&ax, attr, sizeof *attr);
	ax.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
	ax.srq_type = IBV_SRQT_BASIC;
	ax.pd = pd;
	int r = rdma_create_srq_ex(id, &ax);
	memcpy(attr, &ax, sizeof *attr);
	return r;
}

CMA_EXPORT void rdma_destroy_srq(struct rdma_cm_id *id)
{
	if (!id || !id->srq)
		return;
	ibv_destroy_srq(id->srq);
	id->srq = NULL;
	destroy_cqs(id);
}

/* ---- endpoints -------------------------------------------------------------------------- */
CMA_EXPORT int rdma_create_ep(struct rdma_cm_id **id, struct rdma_addrinfo *res, struct ibv_pd *pd,
			      struct ibv_qp_init_attr *qp_init_attr)
{
	if (!id || !res)
		return cma_err(EINVAL);
	struct rdma_cm_id *cm_id;
	enum ibv_qp_type qpt = res->ai_qp_type ? (enum ibv_qp_type)res->ai_qp_type : IBV_QPT_RC;
	if (rdma_create_id(NULL, &cm_id, NULL, (enum rdma_port_space)(res->ai_port_space ? res->ai_port_space
											   : RDMA_PS_TCP)))
		return -1;
	cm_id->qp_type = qpt;
	int r;
	if (res->ai_flags & RAI_PASSIVE) {
		r = rdma_bind_addr(cm_id, res->ai_src_addr);
		if (!r && qp_init_attr) {
			struct cm_id *c = to_cid(cm_id);
			c->ep_qp_attr = malloc(sizeof *qp_init_attr);
			if (!c->ep_qp_attr)
				r = cma_err(ENOMEM);
			else
				*c->ep_qp_attr = *qp_init_attr;
			c->ep_pd = pd;
			cm_id->pd = pd ? pd : cm_id->pd;
		}
	} else {
		r = rdma_resolve_addr(cm_id, res->ai_src_addr, res->ai_dst_addr, 2000);
		if (!r)
			r = rdma_resolve_route(cm_id, 2000);
		if (!r && qp_init_attr)
			r = rdma_create_qp(cm_id, pd, qp_init_attr);
	}
	if (r) {
		int e = errno;
		rdma_destroy_id(cm_id);
		return cma_err(e);
	}
	*id = cm_id;
	return 0;
}

CMA_EXPORT void rdma_destroy_ep(struct rdma_cm_id *id)
{
	if (!id)
		return;
	if (id->qp)
		rdma_destroy_qp(id);
	if (id->srq)
		rdma_destroy_srq(id);
	rdma_destroy_id(id);
}

CMA_EXPORT int rdma_get_request(struct rdma_cm_id *listen, struct rdma_cm_id **id)
{
	if (!listen || !id)
		return cma_err(EINVAL);
	struct cm_id *l = to_cid(listen);
	if (!l->sync)
		return cma_err(EINVAL);
	if (listen->event) {
		rdma_ack_cm_event(listen->event);
		listen->event = NULL;
	}
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(listen->channel, &ev))
		return -1;
	int r = 0;
	if (ev->event == RDMA_CM_EVENT_REJECTED)
		r = cma_err(ECONNREFUSED);
	else if (ev->status)
		r = cma_err(ev->status < 0 ? -ev->status : ev->status);
	else if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST)
		r = cma_err(EINVAL);
	else if (l->ep_qp_attr) {
		struct ibv_qp_init_attr a = *l->ep_qp_attr;
		r = rdma_create_qp(ev->id, l->ep_pd ? l->ep_pd : listen->pd, &a);
	}
	if (r) {
		listen->event = ev;
		return r;
	}
	*id = ev->id;
	(*id)->event = ev;
	return 0;
}
