/* Emulated librdmacm: the connection handshake.
 *
 * Messages follow the IB CM: the active side sends REQ (SIDR REQ for UD ids),
 * the passive side answers REP or REJ (SIDR REP), the active side's RTU makes
 * both ESTABLISHED; DREQ/DREP disconnect.  Each connection has its own unix
 * seqpacket socket between the two agents; a socket that closes without a
 * goodbye is what the kernel CM of a dead process would have sent: a REJ in
 * the handshake states, a DREQ once established.  Events carry what the real
 * library reports, private data included at the IB CM's fixed sizes (56 bytes
 * in a REQ of an IP id, 196 in a REP, 148 in a REJ), zero-padded.
 *
 * Over 600 lines: the IB CM's connection state machine, both sides and every message in
 * one place, since each handler reads the states the others set.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cma.h"

static int is_ud(const struct cm_id *c) { return c->id.qp_type == IBV_QPT_UD; }
static int is_ib_family(const struct cm_id *c) { return c->id.route.addr.src_addr.sa_family == AF_IB; }

static struct cm_id *id_by_sock(int fd)
{
	for (struct cm_id *c = cma.ids; c; c = c->next)
		if (c->sock == fd)
			return c;
	return NULL;
}

static int take_pending(int fd)
{
	for (struct cm_pending_sock **pp = &cma.pending; *pp; pp = &(*pp)->next)
		if ((*pp)->fd == fd) {
			struct cm_pending_sock *p = *pp;
			*pp = p->next;
			free(p);
			return 1;
		}
	return 0;
}

static void msg_pdata(struct cmw_msg *m, const void *pdata, uint8_t len)
{
	if (pdata && len) {
		memcpy(m->pdata, pdata, len);
		m->pdlen = len;
	}
}

/* A REJ, or (SIDR, UD ids) a SIDR REP with that status. */
static void send_status(int fd, int type, int status, const void *pdata, uint8_t len)
{
	struct cmw_msg m;
	cma_msg_init(&m, type);
	m.status = (uint32_t)status;
	msg_pdata(&m, pdata, len);
	cma_send(fd, &m);
}

static void send_rej(int fd, int reason, const void *pdata, uint8_t len)
{
	send_status(fd, CMW_REJ, reason, pdata, len);
}

static void send_simple(int fd, int type)
{
	struct cmw_msg m;
	cma_msg_init(&m, type);
	cma_send(fd, &m);
}

/* An event on c with the private data of m, at the IB CM message's size. */
static struct cm_event *event_with_pdata(struct cm_id *c, struct cm_id *owner, int type, int status,
					 const struct cmw_msg *m, int size)
{
	struct cm_event *e = cma_event_new(c, owner, type, status);
	if (!e)
		return NULL;
	if (m && m->pdlen)
		memcpy(e->pdata, m->pdata, m->pdlen < size ? m->pdlen : (size_t)size);
	if (is_ud(c)) {
		e->ev.param.ud.private_data = e->pdata;
		e->ev.param.ud.private_data_len = (uint8_t)size;
	} else {
		e->ev.param.conn.private_data = e->pdata;
		e->ev.param.conn.private_data_len = (uint8_t)size;
	}
	return e;
}

/* What a REQ or REP (SIDR REQ or REP: ud) carries, as the event's parameters report it to the other
 * side. */
static void event_params_of(struct cm_event *e, const struct cmw_msg *m, int ud)
{
	if (ud) {
		struct rdma_ud_param *u = &e->ev.param.ud;
		u->ah_attr.dlid = (uint16_t)m->lid;
		u->ah_attr.port_num = 1;
		u->qp_num = m->qpn;
		u->qkey = m->qkey;
		return;
	}
	struct rdma_conn_param *cp = &e->ev.param.conn;
	cp->responder_resources = m->init_depth;
	cp->initiator_depth = m->resp_res;
	cp->flow_control = m->flow_control;
	cp->retry_count = m->retry_count;
	cp->rnr_retry_count = m->rnr_retry_count;
	cp->srq = m->srq;
	cp->qp_num = m->qpn;
}

/* A REQ or REP of c: its QP (or the parameters' QPN), PSN, Q_Key, depths and private data. */
static void msg_of_conn(struct cmw_msg *m, const struct cm_id *c, const struct rdma_conn_param *p)
{
	m->qpn = c->id.qp ? c->id.qp->qp_num : p ? p->qp_num : 0;
	m->srq = c->id.qp ? !!c->id.qp->srq : p ? p->srq : 0;
	m->psn = c->local_psn;
	m->qkey = RDMA_UDP_QKEY;
	m->resp_res = c->resp_res;
	m->init_depth = c->init_depth;
	m->flow_control = p ? p->flow_control : 0;
	m->src = c->id.route.addr.src_storage;
	if (p)
		msg_pdata(m, p->private_data, p->private_data_len);
}

static void close_with(struct cm_id *c, int state)
{
	cma_close_sock(c);
	c->state = state;
	c->timer = CT_NONE;
}

/* In state `state`, c closes with event `type`. */
static void closed_on(struct cm_id *c, int state, int type, int status)
{
	if (c->state == state) {
		close_with(c, CS_CLOSED);
		cma_queue_event(c, type, status);
	}
}

int cma_modify_qp_err(struct cm_id *c)
{
	if (!c->id.qp)
		return 0;
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
	int r = ibv_modify_qp(c->id.qp, &a, IBV_QP_STATE);
	return r ? cma_err(r) : 0;
}

/* ---- active side ------------------------------------------------------------------ */
static int valid_param(struct cm_id *c, const struct rdma_conn_param *p)
{
	if (c->id.ps != RDMA_PS_TCP)
		return 0;
	if (!c->id.qp && !p)
		return cma_err(EINVAL);
	if (p && ((p->responder_resources != RDMA_MAX_RESP_RES && p->responder_resources > CM_MAX_RD_ATOMIC) ||
		  (p->initiator_depth != RDMA_MAX_INIT_DEPTH && p->initiator_depth > CM_MAX_RD_ATOMIC)))
		return cma_err(EINVAL);
	return 0;
}

/* id in `state` with valid connection parameters p, the library's lock taken; else NULL (errno
 * EINVAL), unlocked. */
static struct cm_id *lock_to_answer(struct rdma_cm_id *id, int state, const struct rdma_conn_param *p)
{
	if (!id) {
		cma_err(EINVAL);
		return NULL;
	}
	struct cm_id *c = to_cid(id);
	pthread_mutex_lock(&cma.lock);
	if (c->state != state)
		errno = EINVAL;
	else if (!valid_param(c, p))
		return c;
	pthread_mutex_unlock(&cma.lock);
	return NULL;
}

/* The end of a call that sent its message: 0 -> wait for what the caller asked for (a blocking
 * channel's event), as librdmacm's ucma_complete. */
static int unlock_then_complete(struct rdma_cm_id *id, int r)
{
	pthread_mutex_unlock(&cma.lock);
	return r ? r : cma_complete(id);
}

CMA_EXPORT int rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *p)
{
	struct cm_id *c = lock_to_answer(id, CS_ROUTE_RESOLVED, p);
	if (!c)
		return -1;
	int r = -1;
	int max = is_ud(c) ? CM_SIDR_REQ_PDATA : CM_REQ_PDATA;
	if (!is_ib_family(c))
		max -= CM_IP_HDR;
	if (p && p->private_data_len > max) {
		errno = EINVAL;
		goto out;
	}
	c->init_depth = p && p->initiator_depth != RDMA_MAX_INIT_DEPTH ? p->initiator_depth : CM_MAX_RD_ATOMIC;
	c->resp_res = p && p->responder_resources != RDMA_MAX_RESP_RES ? p->responder_resources : CM_MAX_RD_ATOMIC;
	c->retry_count = p ? p->retry_count : 7;
	c->rnr_retry_count = p ? p->rnr_retry_count : 7;

	struct cmw_msg m;
	cma_msg_init(&m, is_ud(c) ? CMW_SIDR_REQ : CMW_REQ);
	msg_of_conn(&m, c, p);
	m.ps = c->id.ps;
	m.qp_type = (uint8_t)c->id.qp_type;
	m.retry_count = c->retry_count;
	m.rnr_retry_count = c->rnr_retry_count;
	m.dst = c->id.route.addr.dst_storage;
	c->connected_once = 1;
	c->state = CS_REQ_SENT;
	int fd = cma_agent_connect(c->peer.lid);
	if (fd < 0 || cma_send(fd, &m)) {
		/* the node's agent is gone: nobody answers the REQ */
		CMA_LOG("connect: node lid %u does not answer (%s)", c->peer.lid, strerror(errno));
		if (fd >= 0)
			close(fd);
		cma_set_timer(c, CT_REQ, 0, -ETIMEDOUT);
	} else {
		c->sock = fd;
		cma_set_timer(c, CT_REQ, cma.cm_timeout_ms, -ETIMEDOUT);
	}
	r = 0;
out:
	return unlock_then_complete(id, r);
}

/* A CONNECT_RESPONSE retrieved on an id with a QP: RTR, RTS and the RTU, or
 * a REJ when the QP cannot follow (librdmacm's ucma_process_conn_resp). */
int cma_process_conn_resp(struct cm_id *c)
{
	if (c->state != CS_REP_RCVD)
		return -EINVAL;
	if (cma_modify_qp_rtr(c, RDMA_MAX_RESP_RES) || cma_modify_qp_rts(c, RDMA_MAX_INIT_DEPTH)) {
		int e = errno;
		cma_modify_qp_err(c);
		send_rej(c->sock, CM_REJ_CONSUMER_DEFINED, NULL, 0);
		close_with(c, CS_CLOSED);
		return -e;
	}
	send_simple(c->sock, CMW_RTU);
	c->state = CS_ESTABLISHED;
	return 0;
}

CMA_EXPORT int rdma_establish(struct rdma_cm_id *id)
{
	if (!id || id->qp)
		return cma_err(EINVAL);
	struct cm_id *c = to_cid(id);
	pthread_mutex_lock(&cma.lock);
	int r = 0;
	if (c->state == CS_REP_RCVD) {
		send_simple(c->sock, CMW_RTU);
		c->state = CS_ESTABLISHED;
	} else {
		r = cma_err(EINVAL);
	}
	pthread_mutex_unlock(&cma.lock);
	return r;
}

/* ---- passive side ------------------------------------------------------------------- */
CMA_EXPORT int rdma_listen(struct rdma_cm_id *id, int backlog)
{
	if (!id)
		return cma_err(EINVAL);
	struct cm_id *c = to_cid(id);
	if (c->state == CS_IDLE) {   /* listening unbound: the IPv4 wildcard, an ephemeral port */
		struct sockaddr_in any = { .sin_family = AF_INET };
		if (rdma_bind_addr(id, (struct sockaddr *)&any))
			return -1;
	}
	pthread_mutex_lock(&cma.lock);
	int r = 0;
	if (c->state == CS_ADDR_BOUND) {
		/* another listener on the same port and address */
		for (struct cm_id *o = cma.ids; o; o = o->next)
			if (o != c && !o->destroyed && o->state == CS_LISTEN && o->id.ps == c->id.ps &&
			    cma_addr_port(&o->id.route.addr.src_addr) == cma_addr_port(&c->id.route.addr.src_addr) &&
			    (cma_addr_is_any(&o->id.route.addr.src_addr) || cma_addr_is_any(&c->id.route.addr.src_addr) ||
			     cma_addr_equal(&o->id.route.addr.src_addr, &c->id.route.addr.src_addr)))
				r = cma_err(EADDRINUSE);
		if (!r)
			c->state = CS_LISTEN;
	} else if (c->state != CS_LISTEN) {
		r = cma_err(EINVAL);
	}
	(void)backlog;
	char b[96];
	CMA_LOG("listen id %p on %s -> %d", (void *)id, cma_addr_str(&c->id.route.addr.src_addr, b, sizeof b), r);
	pthread_mutex_unlock(&cma.lock);
	return r;
}

/* The peer's QP, PSN and depths from its REQ or REP, as the IB CM sets them on this side: the
 * peer's initiator depth is our responder resources and the other way round. */
static void take_peer(struct cm_id *c, const struct cmw_msg *m)
{
	c->remote_qpn = m->qpn;
	c->remote_psn = m->psn;
	c->resp_res = m->init_depth;
	c->init_depth = m->resp_res;
	c->remote_rnr_retry = m->rnr_retry_count;
}

static struct cm_id *find_listener(const struct cmw_msg *m)
{
	const struct sockaddr *dst = (const struct sockaddr *)&m->dst;
	uint16_t port = cma_addr_port(dst);
	for (struct cm_id *c = cma.ids; c; c = c->next) {
		if (c->destroyed || c->state != CS_LISTEN || c->id.ps != (enum rdma_port_space)m->ps)
			continue;
		const struct sockaddr *la = &c->id.route.addr.src_addr;
		if (cma_addr_port(la) != port)
			continue;
		if (cma_addr_is_any(la) || cma_addr_equal(la, dst))
			return c;
	}
	return NULL;
}

static void on_req(int fd, const struct cmw_msg *m)
{
	int ud = m->type == CMW_SIDR_REQ;
	struct cm_id *l = find_listener(m);
	char b[96];
	CMA_LOG("%s for %s (ps 0x%x) from lid %u: %s", ud ? "SIDR REQ" : "REQ",
		cma_addr_str((const struct sockaddr *)&m->dst, b, sizeof b), m->ps, m->lid, l ? "listener" : "no listener");
	if (!l) {
		send_status(fd, ud ? CMW_SIDR_REP : CMW_REJ, ud ? CM_SIDR_UNSUPPORTED : CM_REJ_INVALID_SID, NULL, 0);
		close(fd);
		return;
	}
	struct cm_id *c = cma_id_alloc(to_cch(l->id.channel), l->id.context, l->id.ps, l->id.qp_type);
	if (!c) {
		send_rej(fd, CM_REJ_CONSUMER_DEFINED, NULL, 0);
		close(fd);
		return;
	}
	c->sock = fd;
	c->connected_once = 1;
	c->state = CS_REQ_RCVD;
	cma_set_verbs(c);
	memcpy(&c->id.route.addr.src_storage, &m->dst, sizeof m->dst);
	memcpy(&c->id.route.addr.dst_storage, &m->src, sizeof m->src);
	c->peer.lid = m->lid;
	memcpy(c->peer.gid, m->gid, 16);
	cma_fill_ibaddr(c);
	cma_fill_path(c);
	take_peer(c, m);
	c->remote_qkey = m->qkey;
	c->retry_count = m->retry_count;
	c->rnr_retry_count = m->rnr_retry_count;
	int size = ud ? CM_SIDR_REQ_PDATA : CM_REQ_PDATA;
	if (((const struct sockaddr *)&m->dst)->sa_family != AF_IB)
		size -= CM_IP_HDR;
	struct cm_event *e = event_with_pdata(c, l, RDMA_CM_EVENT_CONNECT_REQUEST, 0, m, size);
	if (!e) {
		send_rej(fd, CM_REJ_CONSUMER_DEFINED, NULL, 0);
		c->destroyed = 1;
		cma_id_maybe_free(c);
		return;
	}
	e->ev.listen_id = &l->id;
	event_params_of(e, m, ud);
	cma_event_post(e);
}

CMA_EXPORT int rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *p)
{
	struct cm_id *c = lock_to_answer(id, CS_REQ_RCVD, p);
	if (!c)
		return -1;
	int r = -1;
	if (!p || p->initiator_depth == RDMA_MAX_INIT_DEPTH)
		c->init_depth = c->init_depth < CM_MAX_RD_ATOMIC ? c->init_depth : CM_MAX_RD_ATOMIC;
	else
		c->init_depth = p->initiator_depth;
	if (!p || p->responder_resources == RDMA_MAX_RESP_RES)
		c->resp_res = c->resp_res < CM_MAX_RD_ATOMIC ? c->resp_res : CM_MAX_RD_ATOMIC;
	else
		c->resp_res = p->responder_resources;
	int max = is_ud(c) ? CM_SIDR_REP_PDATA : CM_REP_PDATA;
	if (p && p->private_data_len > max) {
		errno = EINVAL;
		goto out;
	}
	if (!is_ud(c) && (cma_modify_qp_rtr(c, c->resp_res) || cma_modify_qp_rts(c, c->init_depth)))
		goto out;
	struct cmw_msg m;
	cma_msg_init(&m, is_ud(c) ? CMW_SIDR_REP : CMW_REP);
	msg_of_conn(&m, c, p);
	m.rnr_retry_count = p ? p->rnr_retry_count : 7;
	cma_send(c->sock, &m);   /* a dead peer shows as EOF on the socket */
	if (is_ud(c)) {
		close_with(c, CS_ESTABLISHED);   /* SIDR is done */
		pthread_mutex_unlock(&cma.lock);
		return 0;
	}
	c->state = CS_REP_SENT;
	cma_set_timer(c, CT_RTU, cma.cm_timeout_ms, -ETIMEDOUT);
	r = 0;
out:
	return unlock_then_complete(id, r);
}

static int reject_with_reason(struct rdma_cm_id *id, const void *pdata, uint8_t len, int reason)
{
	if (!id)
		return cma_err(EINVAL);
	struct cm_id *c = to_cid(id);
	pthread_mutex_lock(&cma.lock);
	int r = 0;
	if (c->state != CS_REQ_RCVD && c->state != CS_REP_RCVD) {
		r = cma_err(EINVAL);
	} else if (len > (is_ud(c) ? CM_SIDR_REP_PDATA : CM_REJ_PDATA)) {
		r = cma_err(EINVAL);
	} else {
		send_status(c->sock, is_ud(c) ? CMW_SIDR_REP : CMW_REJ, is_ud(c) ? CM_SIDR_REJECT : reason, pdata, len);
		close_with(c, CS_CLOSED);
	}
	pthread_mutex_unlock(&cma.lock);
	return r;
}

CMA_EXPORT int rdma_reject(struct rdma_cm_id *id, const void *private_data, uint8_t private_data_len)
{
	return reject_with_reason(id, private_data, private_data_len, CM_REJ_CONSUMER_DEFINED);
}

CMA_EXPORT int rdma_reject_ece(struct rdma_cm_id *id, const void *private_data, uint8_t private_data_len)
{
	return reject_with_reason(id, private_data, private_data_len, 35); /* VENDOR_OPTION_NOT_SUPPORTED */
}

/* ---- disconnect ----------------------------------------------------------------------- */
CMA_EXPORT int rdma_disconnect(struct rdma_cm_id *id)
{
	if (!id || !id->verbs)
		return cma_err(EINVAL);
	struct cm_id *c = to_cid(id);
	pthread_mutex_lock(&cma.lock);
	if (!c->connected_once) {
		pthread_mutex_unlock(&cma.lock);
		return cma_err(EINVAL);
	}
	cma_modify_qp_err(c);   /* IB: the QP goes to ERR first */
	int wait = 0;
	switch (c->state) {
	case CS_ESTABLISHED:
		if (c->sock >= 0) {
			send_simple(c->sock, CMW_DREQ);
			c->state = CS_DREQ_SENT;
			cma_set_timer(c, CT_DREQ, cma.cm_timeout_ms, -ETIMEDOUT);
			wait = 1;
		}
		break;
	case CS_DREQ_RCVD:   /* answer the peer's DREQ; DISCONNECTED was reported already */
		send_simple(c->sock, CMW_DREP);
		close_with(c, CS_CLOSED);
		wait = 1;
		break;
	default:
		break;   /* nothing to tell the peer: the kernel returns 0 too, without an event */
	}
	pthread_mutex_unlock(&cma.lock);
	return wait ? cma_complete(id) : 0;
}

/* Destroying an id: what the kernel CM sends for each state. */
void cma_destroy_conn(struct cm_id *c)
{
	switch (c->state) {
	case CS_REQ_SENT:
		if (c->sock >= 0)
			send_rej(c->sock, CM_REJ_TIMEOUT, NULL, 0);
		break;
	case CS_REQ_RCVD:
		send_status(c->sock, is_ud(c) ? CMW_SIDR_REP : CMW_REJ, is_ud(c) ? CM_SIDR_REJECT : CM_REJ_CONSUMER_DEFINED,
			    NULL, 0);
		break;
	case CS_REP_SENT:
	case CS_REP_RCVD:
		send_rej(c->sock, CM_REJ_CONSUMER_DEFINED, NULL, 0);
		break;
	case CS_ESTABLISHED:
		send_simple(c->sock, CMW_DREQ);
		break;
	case CS_DREQ_RCVD:
		send_simple(c->sock, CMW_DREP);
		break;
	default:
		break;
	}
	close_with(c, c->state == CS_LISTEN ? CS_LISTEN : CS_CLOSED);
}

/* ---- incoming messages (agent thread, lock held) ------------------------------------------ */
void cma_handle_msg(int fd, const struct cmw_msg *m)
{
	if (take_pending(fd)) {
		if (m->type == CMW_REQ || m->type == CMW_SIDR_REQ)
			on_req(fd, m);
		else
			close(fd);
		return;
	}
	struct cm_id *c = id_by_sock(fd);
	if (!c)
		return;
	struct cm_event *e;
	switch (m->type) {
	case CMW_REP:
		if (c->state != CS_REQ_SENT)
			break;
		c->timer = CT_NONE;
		take_peer(c, m); /* what the REP grants */
		c->state = CS_REP_RCVD;
		e = event_with_pdata(c, c, RDMA_CM_EVENT_CONNECT_RESPONSE, 0, m, CM_REP_PDATA);
		if (e) {
			event_params_of(e, m, 0);
			cma_event_post(e);
		}
		break;
	case CMW_SIDR_REP:
		if (c->state != CS_REQ_SENT)
			break;
		close_with(c, m->status ? CS_CLOSED : CS_ESTABLISHED);
		e = event_with_pdata(c, c, m->status ? RDMA_CM_EVENT_UNREACHABLE : RDMA_CM_EVENT_ESTABLISHED,
				     (int)m->status, m, CM_SIDR_REP_PDATA);
		if (e) {
			event_params_of(e, m, 1);
			c->remote_qpn = m->qpn;
			c->remote_qkey = m->qkey;
			cma_event_post(e);
		}
		break;
	case CMW_RTU:
		if (c->state != CS_REP_SENT)
			break;
		c->timer = CT_NONE;
		c->state = CS_ESTABLISHED;
		cma_queue_event(c, RDMA_CM_EVENT_ESTABLISHED, 0);
		break;
	case CMW_REJ:
		if (c->state != CS_REQ_SENT && c->state != CS_REP_RCVD && c->state != CS_REQ_RCVD &&
		    c->state != CS_REP_SENT)
			break;
		close_with(c, CS_CLOSED);
		e = event_with_pdata(c, c, RDMA_CM_EVENT_REJECTED, (int)m->status, m, CM_REJ_PDATA);
		if (e)
			cma_event_post(e);
		break;
	case CMW_DREQ:
		if (c->state == CS_ESTABLISHED) {
			c->state = CS_DREQ_RCVD;
			cma_queue_event(c, RDMA_CM_EVENT_DISCONNECTED, 0);
		} else if (c->state == CS_DREQ_SENT) {   /* both sides disconnected at once */
			send_simple(fd, CMW_DREP);
			close_with(c, CS_CLOSED);
			cma_queue_event(c, RDMA_CM_EVENT_DISCONNECTED, 0);
		}
		break;
	case CMW_DREP:
		closed_on(c, CS_DREQ_SENT, RDMA_CM_EVENT_DISCONNECTED, 0);
		break;
	default:
		break;
	}
}

/* The peer's socket closed: its process exited or was killed (the kernel CM
 * would have sent what cma_destroy_conn sends for the peer's state). */
void cma_handle_eof(int fd)
{
	if (take_pending(fd)) {
		close(fd);
		return;
	}
	struct cm_id *c = id_by_sock(fd);
	if (!c) {
		close(fd);
		return;
	}
	int st = c->state;
	close_with(c, st == CS_LISTEN ? st : CS_CLOSED);
	CMA_LOG("id %p: peer lid %u closed the connection in state %d", (void *)&c->id, c->peer.lid, st);
	struct cm_event *e = NULL;
	switch (st) {
	case CS_REQ_SENT:       /* the passive side was destroyed with our REQ */
	case CS_REP_RCVD:
	case CS_REP_SENT:
		if (is_ud(c) && st == CS_REQ_SENT)
			e = cma_event_new(c, c, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT);
		else
			e = event_with_pdata(c, c, RDMA_CM_EVENT_REJECTED, CM_REJ_CONSUMER_DEFINED, NULL, CM_REJ_PDATA);
		break;
	case CS_REQ_RCVD:       /* the active side went away before an answer */
		e = event_with_pdata(c, c, RDMA_CM_EVENT_REJECTED, CM_REJ_TIMEOUT, NULL, CM_REJ_PDATA);
		break;
	case CS_ESTABLISHED:    /* the peer's kernel sent a DREQ */
	case CS_DREQ_SENT:
		e = cma_event_new(c, c, RDMA_CM_EVENT_DISCONNECTED, 0);
		break;
	default:
		break;
	}
	if (e)
		cma_event_post(e);
}

void cma_timer_fired(struct cm_id *c)
{
	int kind = c->timer, status = c->timer_status;
	c->timer = CT_NONE;
	switch (kind) {
	case CT_ADDR:
		if (c->state == CS_ADDR_QUERY) {
			c->state = CS_ADDR_BOUND;
			cma_queue_event(c, RDMA_CM_EVENT_ADDR_ERROR, status);
		}
		break;
	case CT_ROUTE:
		if (c->state == CS_ROUTE_QUERY && !status) {
			cma_fill_path(c);
			c->state = CS_ROUTE_RESOLVED;
			cma_queue_event(c, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
		} else if (c->state == CS_ROUTE_QUERY) {
			c->state = CS_ADDR_RESOLVED;
			c->id.route.path_rec = NULL;
			c->id.route.num_paths = 0;
			cma_queue_event(c, RDMA_CM_EVENT_ROUTE_ERROR, status);
		}
		break;
	case CT_REQ:            /* no REP: the REQ's retries are exhausted */
		if (c->state == CS_REQ_SENT) {
			if (c->sock >= 0)
				send_rej(c->sock, CM_REJ_TIMEOUT, NULL, 0);
			close_with(c, CS_CLOSED);
			cma_queue_event(c, RDMA_CM_EVENT_UNREACHABLE, status);
		}
		break;
	case CT_RTU:            /* no RTU */
		closed_on(c, CS_REP_SENT, RDMA_CM_EVENT_UNREACHABLE, status);
		break;
	case CT_DREQ:           /* no DREP */
		closed_on(c, CS_DREQ_SENT, RDMA_CM_EVENT_DISCONNECTED, status);
		break;
	default:
		break;
	}
}
