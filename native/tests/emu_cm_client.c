/* emu_cm_client -- rdma_cm over the emulated HCA (native/emu/rdmacm): the
 * connection manager's paths between processes, as tests/test_emu_rdmacm.py
 * drives them.  Plain librdmacm calls; the process's node is
 * SIGMATRACE_EMU_LID and owns 127.0.<LID/256>.<LID%256>.
 *
 *   emu_cm_client server --port P [--ud | --ud-qp] [--reject] [--hold] [--hold-established]
 *                        [--defer-accept-ms N] [--count N]
 *       listens on 0.0.0.0:P; for each connect request prints its private
 *       data, then accepts with private data "welcome-from-server" (RC: with
 *       a QP, a SEND/RECV exchange once ESTABLISHED), rejects with "go-away"
 *       (--reject), or sleeps (--hold, for the test to kill it); waits for
 *       DISCONNECTED.  --hold-established sleeps after the exchange.  --ud:
 *       RDMA_PS_UDP ids, SIDR handshake with QP numbers only; --ud-qp: with UD
 *       QPs, and one datagram client -> server through an AH made from the
 *       SIDR reply's ah_attr.
 *   emu_cm_client client --addr A --port P [--ud | --ud-qp] [--sync] [--timeout-ms T]
 *                        [--disconnect | --wait-disconnect] [--pdata-len N]
 *       resolves A, connects with private data "hello-from-client" and prints
 *       what comes back: ESTABLISHED (+ exchange), REJECTED, UNREACHABLE,
 *       ADDR_ERROR; --sync uses ids without a channel (blocking calls).
 *   emu_cm_client ud-probe
 *       prints "UD_PROBE ok" when the emulated HCA makes UD QPs.
 *   emu_cm_client checks
 *       in one process: API checks (getaddrinfo, bind errors, ports, event
 *       channel fd semantics, migrate, init_qp_attr, parameter errors) and a
 *       loopback connection with private data and a SEND each way; AF_IB
 *       addresses with the QP-less handshake (CONNECT_RESPONSE,
 *       rdma_establish); the synchronous endpoint API (rdma_create_ep,
 *       rdma_get_request).
 * Output: one "KEY field=value ..." line per observation, then "RESULT OK"
 * or "RESULT FAIL ...".  Every wait is bounded.
 *
 * Over 600 lines: a test program; one binary with the server and client of every rdma_cm
 * path the test drives by its arguments.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/ib.h>
#include <poll.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int fails;
#define EXPECT(c, ...) do { if (!(c)) { fails++; printf("FAIL %s:%d: ", __func__, __LINE__); printf(__VA_ARGS__); printf("\n"); fflush(stdout); } } while (0)
#define DIE(...) do { printf("RESULT FAIL "); printf(__VA_ARGS__); printf("\n"); fflush(stdout); exit(2); } while (0)
#define OUT(...) do { printf(__VA_ARGS__); printf("\n"); fflush(stdout); } while (0)

static const char CLIENT_PDATA[] = "hello-from-client";
static const char SERVER_PDATA[] = "welcome-from-server";
static const char REJECT_PDATA[] = "go-away";
#define WAIT_MS 20000

/* ---- helpers -------------------------------------------------------------------- */
static struct rdma_cm_event *wait_event(struct rdma_event_channel *ch, int ms)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	for (;;) {
		int r = poll(&p, 1, ms);
		if (r == 0)
			return NULL;
		if (r < 0 && errno == EINTR)
			continue;
		struct rdma_cm_event *ev;
		if (rdma_get_cm_event(ch, &ev) == 0)
			return ev;
		if (errno != EAGAIN)
			DIE("rdma_get_cm_event: %s", strerror(errno));
	}
}

static struct rdma_cm_event *expect_event(struct rdma_event_channel *ch, enum rdma_cm_event_type type)
{
	struct rdma_cm_event *ev = wait_event(ch, WAIT_MS);
	if (!ev)
		DIE("timeout waiting for %s", rdma_event_str(type));
	if (ev->event != type)
		DIE("got %s status %d, wanted %s", rdma_event_str(ev->event), ev->status, rdma_event_str(type));
	return ev;
}

static void pdata_str(const void *p, int len, char *out, size_t n)
{
	size_t k = 0;
	for (int i = 0; i < len && k + 1 < n; i++) {
		unsigned char c = ((const unsigned char *)p)[i];
		if (!c)
			break;
		out[k++] = (c > 32 && c < 127) ? (char)c : '.';
	}
	out[k] = 0;
}

static int pdata_tail_zero(const void *p, int len, int from)
{
	for (int i = from; i < len; i++)
		if (((const unsigned char *)p)[i])
			return 0;
	return 1;
}

static struct sockaddr_in addr_of(const char *ip, int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	if (inet_pton(AF_INET, ip, &a.sin_addr) != 1)
		DIE("bad address %s", ip);
	return a;
}

/* A QP on the id (library-made CQs), a registered buffer, one receive posted. */
struct conn {
	struct ibv_mr *mr;
	char *buf;
};

/* A 4 KiB registered buffer for the connection, and one receive into its upper half. */
static void buffer_and_receive(struct rdma_cm_id *id, struct conn *c)
{
	c->buf = calloc(1, 4096);
	c->mr = ibv_reg_mr(id->pd, c->buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	if (!c->mr)
		DIE("ibv_reg_mr: %s", strerror(errno));
	struct ibv_sge sg = { .addr = (uintptr_t)c->buf + 2048, .length = 2048, .lkey = c->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = &sg, .num_sge = 1 }, *bad;
	if (ibv_post_recv(id->qp, &wr, &bad))
		DIE("ibv_post_recv");
}

static void make_qp(struct rdma_cm_id *id, struct conn *c)
{
	struct ibv_qp_init_attr ia = { .qp_type = IBV_QPT_RC, .sq_sig_all = 1,
				       .cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 } };
	if (rdma_create_qp(id, NULL, &ia))
		DIE("rdma_create_qp: %s", strerror(errno));
	EXPECT(id->qp && id->send_cq && id->recv_cq, "rdma_create_qp made no CQs");
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	ibv_query_qp(id->qp, &qa, IBV_QP_STATE, &qi);
	EXPECT(qa.qp_state == IBV_QPS_INIT, "new QP in state %d, want INIT", qa.qp_state);
	buffer_and_receive(id, c);
}

/* A UD QP on a PS_UDP id: rdma_create_qp takes it to RTS with the CM's qkey. */
static void make_ud_qp(struct rdma_cm_id *id, struct conn *c)
{
	struct ibv_qp_init_attr ia = { .qp_type = IBV_QPT_UD, .sq_sig_all = 1,
				       .cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 } };
	if (rdma_create_qp(id, NULL, &ia))
		DIE("rdma_create_qp(UD): %s", strerror(errno));
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	ibv_query_qp(id->qp, &qa, IBV_QP_STATE | IBV_QP_QKEY, &qi);
	EXPECT(qa.qp_state == IBV_QPS_RTS && qa.qkey == RDMA_UDP_QKEY, "UD QP state %d qkey 0x%x", qa.qp_state, qa.qkey);
	buffer_and_receive(id, c);
}

static int poll_one(struct ibv_cq *cq, struct ibv_wc *wc, int ms);

/* The UD datagram of the SIDR-connected pair: the server receives it (after the
 * 40-byte GRH area) from the client's QP. */
static void ud_recv(struct rdma_cm_id *id, struct conn *c)
{
	struct ibv_wc wc;
	if (!poll_one(id->recv_cq, &wc, WAIT_MS) || wc.status != IBV_WC_SUCCESS)
		DIE("UD receive: %s", ibv_wc_status_str(wc.status));
	EXPECT(!strcmp(c->buf + 2048 + 40, "ud-ping"), "UD payload '%s'", c->buf + 2048 + 40);
	OUT("UD_RECV ok payload=%s src_qp=0x%x slid=%u", c->buf + 2048 + 40, wc.src_qp, wc.slid);
}

static void ud_send(struct rdma_cm_id *id, struct conn *c, struct rdma_ud_param *u)
{
	struct ibv_ah *ah = ibv_create_ah(id->pd, &u->ah_attr);
	if (!ah)
		DIE("ibv_create_ah: %s", strerror(errno));
	snprintf(c->buf, 64, "ud-ping");
	struct ibv_sge sg = { .addr = (uintptr_t)c->buf, .length = 8, .lkey = c->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 4, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED,
				  .wr.ud = { .ah = ah, .remote_qpn = u->qp_num, .remote_qkey = u->qkey } }, *bad;
	struct ibv_wc wc;
	if (ibv_post_send(id->qp, &wr, &bad))
		DIE("ibv_post_send(UD): %s", strerror(errno));
	if (!poll_one(id->send_cq, &wc, WAIT_MS) || wc.status != IBV_WC_SUCCESS)
		DIE("UD send completion: %s", ibv_wc_status_str(wc.status));
	OUT("UD_SEND ok qp_num=0x%x", id->qp->qp_num);
	ibv_destroy_ah(ah);
}

static int poll_one(struct ibv_cq *cq, struct ibv_wc *wc, int ms)
{
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n)
			return n;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 > ms)
			return 0;
		usleep(100);
	}
}

/* SEND `msg`, expect `want` back (the peer does the reverse). */
static void exchange(struct rdma_cm_id *id, struct conn *c, const char *msg, const char *want, int send_first)
{
	struct ibv_wc wc;
	for (int step = 0; step < 2; step++) {
		if ((step == 0) == !!send_first) {
			snprintf(c->buf, 2048, "%s", msg);
			struct ibv_sge sg = { .addr = (uintptr_t)c->buf, .length = (uint32_t)strlen(msg) + 1, .lkey = c->mr->lkey };
			struct ibv_send_wr wr = { .wr_id = 2, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_SEND,
						  .send_flags = IBV_SEND_SIGNALED }, *bad;
			if (ibv_post_send(id->qp, &wr, &bad))
				DIE("ibv_post_send: %s", strerror(errno));
			if (!poll_one(id->send_cq, &wc, WAIT_MS) || wc.status != IBV_WC_SUCCESS)
				DIE("send completion: %s", ibv_wc_status_str(wc.status));
		} else {
			if (!poll_one(id->recv_cq, &wc, WAIT_MS))
				DIE("no receive completion");
			if (wc.status != IBV_WC_SUCCESS)
				DIE("receive completion: %s", ibv_wc_status_str(wc.status));
			EXPECT(!strcmp(c->buf + 2048, want), "received '%s', want '%s'", c->buf + 2048, want);
		}
	}
	OUT("EXCHANGE ok sent=%s received=%s", msg, c->buf + 2048);
}

static void destroy_conn(struct rdma_cm_id *id, struct conn *c)
{
	if (c->mr)
		ibv_dereg_mr(c->mr);
	free(c->buf);
	if (id->qp)
		rdma_destroy_qp(id);
}

/* The server's connection id and its objects gone; c made empty for the next one. */
static void drop_child(struct rdma_cm_id **child, struct conn *c)
{
	destroy_conn(*child, c);
	memset(c, 0, sizeof *c);
	rdma_destroy_id(*child);
	*child = NULL;
}

/* ---- server ------------------------------------------------------------------------ */
struct opts {
	const char *addr;
	int port, ud, ud_qp, sync, timeout_ms, reject, hold, hold_established, defer_ms, count, disconnect, wait_disconnect;
	int pdata_len;
};

static int server(const struct opts *o)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	if (!ch)
		DIE("rdma_create_event_channel: %s", strerror(errno));
	struct rdma_cm_id *lid;
	if (rdma_create_id(ch, &lid, NULL, o->ud ? RDMA_PS_UDP : RDMA_PS_TCP))
		DIE("rdma_create_id: %s", strerror(errno));
	struct sockaddr_in a = addr_of("0.0.0.0", o->port);
	if (rdma_bind_addr(lid, (struct sockaddr *)&a))
		DIE("rdma_bind_addr: %s", strerror(errno));
	if (rdma_listen(lid, 8))
		DIE("rdma_listen: %s", strerror(errno));
	OUT("LISTENING port=%u", ntohs(rdma_get_src_port(lid)));
	int done = 0;
	struct rdma_cm_id *child = NULL;
	struct conn c = { 0 };
	while (done < o->count) {
		struct rdma_cm_event *ev = wait_event(ch, WAIT_MS);
		if (!ev)
			DIE("server: timeout waiting for an event");
		char s[256];
		switch (ev->event) {
		case RDMA_CM_EVENT_CONNECT_REQUEST: {
			child = ev->id;
			EXPECT(ev->listen_id == lid, "listen_id %p, want %p", (void *)ev->listen_id, (void *)lid);
			EXPECT(child->verbs != NULL, "conn request id without verbs");
			char peer[64];
			inet_ntop(AF_INET, &((struct sockaddr_in *)rdma_get_peer_addr(child))->sin_addr, peer, sizeof peer);
			if (o->ud) {
				struct rdma_ud_param *u = &ev->param.ud;
				pdata_str(u->private_data, u->private_data_len, s, sizeof s);
				OUT("REQ ud=1 pdata_len=%d pdata=%s qp_num=0x%x qkey=0x%x peer=%s", u->private_data_len, s,
				    u->qp_num, u->qkey, peer);
			} else {
				struct rdma_conn_param *p = &ev->param.conn;
				pdata_str(p->private_data, p->private_data_len, s, sizeof s);
				OUT("REQ pdata_len=%d pdata=%s pdata_tail_zero=%d qp_num=0x%x responder_resources=%d "
				    "initiator_depth=%d peer=%s peer_port=%u local_port=%u", p->private_data_len, s,
				    pdata_tail_zero(p->private_data, p->private_data_len, (int)sizeof CLIENT_PDATA),
				    p->qp_num, p->responder_resources, p->initiator_depth, peer,
				    ntohs(rdma_get_dst_port(child)), ntohs(rdma_get_src_port(child)));
			}
			rdma_ack_cm_event(ev);
			if (o->hold) {
				OUT("HOLDING");
				for (;;)
					pause();
			}
			if (o->defer_ms) {   /* events of the request before answering it */
				struct rdma_cm_event *e2 = wait_event(ch, o->defer_ms);
				if (e2) {
					OUT("CHILD_%s status=%d pdata_len=%d", rdma_event_str(e2->event) + strlen("RDMA_CM_EVENT_"),
					    e2->status, e2->param.conn.private_data_len);
					int same = e2->id == child;
					rdma_ack_cm_event(e2);
					if (same) {
						struct rdma_conn_param cp0 = { .responder_resources = 1, .initiator_depth = 1,
									       .qp_num = 1 };
						int r = rdma_accept(child, &cp0);
						OUT("ACCEPT_AFTER_REJECT rc=%d errno=%d", r, r ? errno : 0);
						rdma_destroy_id(child);
						child = NULL;
						done++;
						break;
					}
				}
			}
			if (o->reject) {
				if (rdma_reject(child, REJECT_PDATA, sizeof REJECT_PDATA))
					DIE("rdma_reject: %s", strerror(errno));
				OUT("REJECT_SENT");
				rdma_destroy_id(child);
				child = NULL;
				done++;
				break;
			}
			struct rdma_conn_param cp = { .private_data = SERVER_PDATA, .private_data_len = sizeof SERVER_PDATA,
						      .responder_resources = RDMA_MAX_RESP_RES,
						      .initiator_depth = RDMA_MAX_INIT_DEPTH, .rnr_retry_count = 7 };
			if (o->ud_qp)
				make_ud_qp(child, &c);
			else if (o->ud)
				cp.qp_num = 0x5678;   /* SIDR: no QP needed for the handshake */
			else
				make_qp(child, &c);
			if (rdma_accept(child, &cp)) {
				OUT("ACCEPT_FAILED errno=%d", errno);
				drop_child(&child, &c);
				done++;
				break;
			}
			if (o->ud) {
				OUT("ACCEPTED ud=1 qp_num=0x%x", child->qp ? child->qp->qp_num : cp.qp_num);
				if (o->ud_qp)
					ud_recv(child, &c);
				drop_child(&child, &c);
				done++;
			}
			break;
		}
		case RDMA_CM_EVENT_ESTABLISHED:
			OUT("ESTABLISHED side=server pdata_len=%d", ev->param.conn.private_data_len);
			rdma_ack_cm_event(ev);
			exchange(child, &c, "pong", "ping", 0);
			if (o->hold_established) {
				OUT("HOLDING");
				for (;;)
					pause();
			}
			break;
		case RDMA_CM_EVENT_DISCONNECTED:
			OUT("DISCONNECTED side=server status=%d", ev->status);
			rdma_ack_cm_event(ev);
			rdma_disconnect(child);
			drop_child(&child, &c);
			done++;
			break;
		case RDMA_CM_EVENT_REJECTED:
			OUT("CHILD_REJECTED status=%d", ev->status);
			rdma_ack_cm_event(ev);
			if (child)
				drop_child(&child, &c);
			done++;
			break;
		default:
			OUT("EVENT %s status=%d", rdma_event_str(ev->event), ev->status);
			rdma_ack_cm_event(ev);
			done++;
			break;
		}
	}
	rdma_destroy_id(lid);
	rdma_destroy_event_channel(ch);
	OUT(fails ? "RESULT FAIL %d" : "RESULT OK", fails);
	return fails ? 1 : 0;
}

/* ---- client --------------------------------------------------------------------------- */
static void client_established(struct rdma_cm_id *id, struct rdma_cm_event *ev, const struct opts *o, struct conn *c)
{
	char s[256];
	if (o->ud) {
		struct rdma_ud_param *u = &ev->param.ud;
		pdata_str(u->private_data, u->private_data_len, s, sizeof s);
		OUT("ESTABLISHED side=client ud=1 pdata_len=%d pdata=%s qp_num=0x%x qkey=0x%x dlid=%u", u->private_data_len,
		    s, u->qp_num, u->qkey, u->ah_attr.dlid);
		if (o->ud_qp)
			ud_send(id, c, u);
		return;
	}
	struct rdma_conn_param *p = &ev->param.conn;
	pdata_str(p->private_data, p->private_data_len, s, sizeof s);
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	ibv_query_qp(id->qp, &qa, IBV_QP_STATE | IBV_QP_DEST_QPN, &qi);
	OUT("ESTABLISHED side=client pdata_len=%d pdata=%s pdata_tail_zero=%d qp_num=0x%x qp_state=%d dest_qpn=0x%x",
	    p->private_data_len, s, pdata_tail_zero(p->private_data, p->private_data_len, (int)sizeof SERVER_PDATA),
	    p->qp_num, qa.qp_state, qa.dest_qp_num);
	EXPECT(qa.qp_state == IBV_QPS_RTS && qa.dest_qp_num == p->qp_num, "QP state %d dest 0x%x", qa.qp_state,
	       qa.dest_qp_num);
	exchange(id, c, "ping", "pong", 1);
}

static int client(const struct opts *o)
{
	struct rdma_event_channel *ch = o->sync ? NULL : rdma_create_event_channel();
	if (!o->sync && !ch)
		DIE("rdma_create_event_channel: %s", strerror(errno));
	struct rdma_cm_id *id;
	if (rdma_create_id(ch, &id, NULL, o->ud ? RDMA_PS_UDP : RDMA_PS_TCP))
		DIE("rdma_create_id: %s", strerror(errno));
	struct sockaddr_in dst = addr_of(o->addr, o->port);
	struct rdma_cm_event *ev;
	int r = rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, o->timeout_ms);
	if (o->sync) {
		if (r) {
			OUT("ADDR_ERROR sync=1 errno=%d", errno);
			goto out;
		}
	} else {
		if (r)
			DIE("rdma_resolve_addr: %s", strerror(errno));
		ev = wait_event(ch, WAIT_MS);
		if (!ev)
			DIE("timeout waiting for address resolution");
		if (ev->event == RDMA_CM_EVENT_ADDR_ERROR) {
			OUT("ADDR_ERROR status=%d verbs=%d", ev->status, id->verbs != NULL);
			rdma_ack_cm_event(ev);
			goto out;
		}
		EXPECT(ev->event == RDMA_CM_EVENT_ADDR_RESOLVED, "got %s", rdma_event_str(ev->event));
		rdma_ack_cm_event(ev);
	}
	char src[64];
	inet_ntop(AF_INET, &((struct sockaddr_in *)rdma_get_local_addr(id))->sin_addr, src, sizeof src);
	OUT("ADDR_RESOLVED src=%s src_port=%u verbs=%d dev=%s", src, ntohs(rdma_get_src_port(id)), id->verbs != NULL,
	    id->verbs ? ibv_get_device_name(id->verbs->device) : "-");
	if (rdma_resolve_route(id, o->timeout_ms))
		DIE("rdma_resolve_route: %s", strerror(errno));
	if (!o->sync)
		rdma_ack_cm_event(expect_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	OUT("ROUTE_RESOLVED num_paths=%d dlid=%u", id->route.num_paths,
	    id->route.num_paths ? ntohs(id->route.path_rec->dlid) : 0);

	struct conn c = { 0 };
	if (o->ud_qp)
		make_ud_qp(id, &c);
	else if (!o->ud)
		make_qp(id, &c);
	char pd[256];
	memset(pd, 0, sizeof pd);
	memcpy(pd, CLIENT_PDATA, sizeof CLIENT_PDATA);
	struct rdma_conn_param cp = { .private_data = pd,
				      .private_data_len = (uint8_t)(o->pdata_len ? o->pdata_len : (int)sizeof CLIENT_PDATA),
				      .responder_resources = RDMA_MAX_RESP_RES, .initiator_depth = RDMA_MAX_INIT_DEPTH,
				      .retry_count = 7, .rnr_retry_count = 7 };
	if (o->ud && !o->ud_qp)
		cp.qp_num = 0x1234;
	r = rdma_connect(id, &cp);
	if (r && !o->sync) {
		OUT("CONNECT_FAILED errno=%d", errno);
		goto out;
	}
	if (o->sync) {
		ev = id->event;   /* what ucma_complete left there */
		if (!ev) {
			OUT("CONNECT_FAILED errno=%d", errno);
			goto out;
		}
	} else {
		ev = wait_event(ch, WAIT_MS);
		if (!ev)
			DIE("timeout waiting for the connection");
	}
	char s[256];
	switch (ev->event) {
	case RDMA_CM_EVENT_ESTABLISHED:
		client_established(id, ev, o, &c);
		break;
	case RDMA_CM_EVENT_REJECTED:
		pdata_str(ev->param.conn.private_data, ev->param.conn.private_data_len, s, sizeof s);
		OUT("REJECTED status=%d pdata_len=%d pdata=%s%s", ev->status, ev->param.conn.private_data_len, s,
		    o->sync ? " sync=1" : "");
		if (o->sync)
			OUT("SYNC_ERRNO errno=%d", errno);
		break;
	default:
		OUT("%s status=%d", rdma_event_str(ev->event) + strlen("RDMA_CM_EVENT_"), ev->status);
		break;
	}
	int established = ev->event == RDMA_CM_EVENT_ESTABLISHED;
	if (!o->sync)
		rdma_ack_cm_event(ev);
	if (established && !o->ud && o->disconnect) {
		if (rdma_disconnect(id))
			DIE("rdma_disconnect: %s", strerror(errno));
		if (o->sync)
			ev = id->event;
		else
			ev = expect_event(ch, RDMA_CM_EVENT_DISCONNECTED);
		OUT("DISCONNECTED side=client status=%d", ev->status);
		if (!o->sync)
			rdma_ack_cm_event(ev);
	} else if (established && !o->ud && o->wait_disconnect) {
		OUT("WAITING");
		ev = wait_event(ch, WAIT_MS);
		if (!ev)
			DIE("timeout waiting for DISCONNECTED");
		OUT("%s side=client status=%d", rdma_event_str(ev->event) + strlen("RDMA_CM_EVENT_"), ev->status);
		rdma_ack_cm_event(ev);
		/* the QP that lost its peer completes with an error, it does not hang */
		snprintf(c.buf, 64, "late");
		struct ibv_sge sg = { .addr = (uintptr_t)c.buf, .length = 5, .lkey = c.mr->lkey };
		struct ibv_send_wr wr = { .wr_id = 3, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_SEND,
					  .send_flags = IBV_SEND_SIGNALED }, *bad;
		struct ibv_wc wc;
		if (ibv_post_send(id->qp, &wr, &bad))
			OUT("LATE_SEND post_errno=%d", errno);
		else if (poll_one(id->send_cq, &wc, WAIT_MS))
			OUT("LATE_SEND status=%s", ibv_wc_status_str(wc.status));
		else
			OUT("LATE_SEND no_completion");
	}
	destroy_conn(id, &c);
out:
	rdma_destroy_id(id);
	if (ch)
		rdma_destroy_event_channel(ch);
	OUT(fails ? "RESULT FAIL %d" : "RESULT OK", fails);
	return fails ? 1 : 0;
}

/* ---- in-process checks -------------------------------------------------------------------- */
static void own_loopback(char *ip, size_t n)
{
	const char *e = getenv("SIGMATRACE_EMU_LID");
	unsigned lid = e ? (unsigned)strtoul(e, NULL, 0) : 1;
	snprintf(ip, n, "127.0.%u.%u", (lid >> 8) & 0xff, lid & 0xff);
}

static void checks_api(void)
{
	char me[32];
	own_loopback(me, sizeof me);
	EXPECT(!strcmp(rdma_event_str(RDMA_CM_EVENT_ESTABLISHED), "RDMA_CM_EVENT_ESTABLISHED"), "event str");
	EXPECT(!strcmp(rdma_event_str((enum rdma_cm_event_type)99), "UNKNOWN EVENT"), "unknown event str");

	int n = 0;
	struct ibv_context **devs = rdma_get_devices(&n);
	EXPECT(devs && n == 1 && devs[0] && !devs[1], "rdma_get_devices: %d", n);
	if (devs && devs[0])
		OUT("DEVICES n=%d name=%s", n, ibv_get_device_name(devs[0]->device));
	rdma_free_devices(devs);

	/* getaddrinfo: passive wildcard, numeric destination */
	struct rdma_addrinfo hints = { .ai_flags = RAI_PASSIVE, .ai_port_space = RDMA_PS_TCP }, *res;
	EXPECT(rdma_getaddrinfo(NULL, "7471", &hints, &res) == 0, "getaddrinfo passive");
	if (res) {
		EXPECT(res->ai_flags & RAI_PASSIVE && res->ai_src_addr && res->ai_port_space == RDMA_PS_TCP &&
			       res->ai_qp_type == IBV_QPT_RC, "passive rai");
		rdma_freeaddrinfo(res);
	}
	struct rdma_addrinfo h2 = { .ai_flags = RAI_NUMERICHOST, .ai_family = AF_INET, .ai_port_space = RDMA_PS_TCP };
	res = NULL;
	EXPECT(rdma_getaddrinfo(me, "7471", &h2, &res) == 0 && res && res->ai_dst_addr &&
		       res->ai_dst_len == sizeof(struct sockaddr_in) &&
		       ntohs(((struct sockaddr_in *)res->ai_dst_addr)->sin_port) == 7471, "getaddrinfo active");
	rdma_freeaddrinfo(res);

	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *a, *b;
	EXPECT(rdma_create_id(ch, &a, NULL, RDMA_PS_TCP) == 0 && rdma_create_id(ch, &b, NULL, RDMA_PS_TCP) == 0, "ids");
	EXPECT(a->qp_type == IBV_QPT_RC && a->ps == RDMA_PS_TCP && a->channel == ch, "id fields");
	/* bind: not ours, port in use, ephemeral port */
	struct sockaddr_in x = addr_of("10.255.255.1", 0);
	EXPECT(rdma_bind_addr(a, (struct sockaddr *)&x) == -1 && errno == EADDRNOTAVAIL, "bind foreign: %s",
	       strerror(errno));
	x = addr_of(me, 0);
	EXPECT(rdma_bind_addr(a, (struct sockaddr *)&x) == 0 && a->verbs, "bind own address: %s", strerror(errno));
	uint16_t port = ntohs(rdma_get_src_port(a));
	EXPECT(port >= 1024, "ephemeral port %u", port);
	x = addr_of("0.0.0.0", port);
	EXPECT(rdma_bind_addr(b, (struct sockaddr *)&x) == -1 && errno == EADDRINUSE, "bind in use: %s",
	       strerror(errno));
	EXPECT(b->verbs == NULL, "unbound id has verbs");
	int one = 1;
	EXPECT(rdma_set_option(b, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one, sizeof one) == 0, "reuseaddr");
	uint8_t tmo = 18;
	EXPECT(rdma_set_option(b, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &tmo, sizeof tmo) == 0, "ack timeout");
	EXPECT(rdma_set_option(b, 77, 1, &one, sizeof one) == -1 && errno == EINVAL, "bad option");
	/* calls in the wrong state */
	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1, .qp_num = 1 };
	EXPECT(rdma_connect(b, &cp) == -1 && errno == EINVAL, "connect unresolved");
	EXPECT(rdma_accept(b, &cp) == -1 && errno == EINVAL, "accept not a request");
	EXPECT(rdma_reject(b, NULL, 0) == -1 && errno == EINVAL, "reject not a request");
	EXPECT(rdma_resolve_route(b, 100) == -1 && errno == EINVAL, "route unresolved");
	OUT("API_STATE_ERRORS ok");

	/* the channel fd: not readable while empty, EAGAIN when non-blocking */
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	EXPECT(poll(&p, 1, 0) == 0, "empty channel readable");
	int fl = fcntl(ch->fd, F_GETFL);
	fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK);
	struct rdma_cm_event *ev;
	EXPECT(rdma_get_cm_event(ch, &ev) == -1 && errno == EAGAIN, "non-blocking get: %s", strerror(errno));
	fcntl(ch->fd, F_SETFL, fl);
	/* an event makes it readable; migrating the id moves the event */
	struct sockaddr_in d = addr_of(me, port);
	EXPECT(rdma_resolve_addr(b, NULL, (struct sockaddr *)&d, 1000) == 0, "resolve self");
	EXPECT(poll(&p, 1, 2000) == 1, "channel not readable after resolve");
	struct rdma_event_channel *ch2 = rdma_create_event_channel();
	EXPECT(rdma_migrate_id(b, ch2) == 0 && b->channel == ch2, "migrate");
	ev = wait_event(ch2, 2000);
	EXPECT(ev && ev->event == RDMA_CM_EVENT_ADDR_RESOLVED && ev->id == b, "event not migrated");
	if (ev)
		rdma_ack_cm_event(ev);
	fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK);
	EXPECT(rdma_get_cm_event(ch, &ev) == -1 && errno == EAGAIN, "old channel still has the event");
	fcntl(ch->fd, F_SETFL, fl);
	OUT("CHANNEL_SEMANTICS ok");
	/* QP attributes before a connection; private data too long for a REQ */
	struct ibv_qp_attr qa = { .qp_state = IBV_QPS_INIT };
	int mask = 0;
	EXPECT(rdma_init_qp_attr(b, &qa, &mask) == 0 && (mask & IBV_QP_PKEY_INDEX) && (mask & IBV_QP_PORT) &&
		       qa.port_num == 1, "init_qp_attr INIT");
	qa.qp_state = IBV_QPS_RTR;
	EXPECT(rdma_init_qp_attr(b, &qa, &mask) == -1 && errno == EINVAL, "RTR attrs before connecting");
	EXPECT(rdma_resolve_route(b, 1000) == 0, "route self");
	rdma_ack_cm_event(expect_event(ch2, RDMA_CM_EVENT_ROUTE_RESOLVED));
	char big[64] = { 0 };
	struct rdma_conn_param cp2 = { .private_data = big, .private_data_len = 57, .qp_num = 1 };
	EXPECT(rdma_connect(b, &cp2) == -1 && errno == EINVAL, "57 bytes of REQ private data accepted");
	OUT("PDATA_LIMIT ok max=56");
	rdma_destroy_id(a);
	rdma_destroy_id(b);
	rdma_destroy_event_channel(ch);
	rdma_destroy_event_channel(ch2);
}

/* A full connection inside one process (the agent connects to itself). */
static void checks_loopback(void)
{
	char me[32];
	own_loopback(me, sizeof me);
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *l, *cl;
	EXPECT(rdma_create_id(ch, &l, (void *)0x1111, RDMA_PS_TCP) == 0, "listener");
	struct sockaddr_in a = addr_of(me, 0);
	EXPECT(rdma_bind_addr(l, (struct sockaddr *)&a) == 0 && rdma_listen(l, 4) == 0, "listen");
	uint16_t port = ntohs(rdma_get_src_port(l));
	/* the synchronous client in another thread would block: use an async one */
	EXPECT(rdma_create_id(ch, &cl, (void *)0x2222, RDMA_PS_TCP) == 0, "client id");
	struct sockaddr_in d = addr_of(me, port);
	EXPECT(rdma_resolve_addr(cl, NULL, (struct sockaddr *)&d, 1000) == 0, "resolve");
	rdma_ack_cm_event(expect_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	EXPECT(rdma_resolve_route(cl, 1000) == 0, "route");
	rdma_ack_cm_event(expect_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	struct conn cc = { 0 }, sc = { 0 };
	make_qp(cl, &cc);
	struct rdma_conn_param cp = { .private_data = CLIENT_PDATA, .private_data_len = sizeof CLIENT_PDATA,
				      .responder_resources = 2, .initiator_depth = 3, .retry_count = 7, .rnr_retry_count = 7 };
	EXPECT(rdma_connect(cl, &cp) == 0, "connect");
	struct rdma_cm_event *ev = expect_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	struct rdma_cm_id *sv = ev->id;
	EXPECT(ev->listen_id == l && sv->context == (void *)0x1111 && sv->verbs, "request id");
	EXPECT(ev->param.conn.private_data_len == 56 && !strcmp(ev->param.conn.private_data, CLIENT_PDATA),
	       "REQ private data");
	/* the passive side sees the active side's depths swapped */
	EXPECT(ev->param.conn.responder_resources == 3 && ev->param.conn.initiator_depth == 2 &&
		       ev->param.conn.qp_num == cl->qp->qp_num, "REQ params %d %d", ev->param.conn.responder_resources,
	       ev->param.conn.initiator_depth);
	rdma_ack_cm_event(ev);
	make_qp(sv, &sc);
	struct rdma_conn_param sp = { .private_data = SERVER_PDATA, .private_data_len = sizeof SERVER_PDATA,
				      .responder_resources = RDMA_MAX_RESP_RES, .initiator_depth = RDMA_MAX_INIT_DEPTH,
				      .rnr_retry_count = 7 };
	EXPECT(rdma_accept(sv, &sp) == 0, "accept: %s", strerror(errno));
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	ibv_query_qp(sv->qp, &qa, IBV_QP_STATE, &qi);
	EXPECT(qa.qp_state == IBV_QPS_RTS && qa.dest_qp_num == cl->qp->qp_num, "passive QP after accept: %d",
	       qa.qp_state);
	int got_client = 0, got_server = 0;
	for (int i = 0; i < 2; i++) {
		ev = expect_event(ch, RDMA_CM_EVENT_ESTABLISHED);
		if (ev->id == cl) {
			got_client = 1;
			EXPECT(ev->param.conn.private_data_len == 196 &&
				       !strcmp(ev->param.conn.private_data, SERVER_PDATA) &&
				       ev->param.conn.qp_num == sv->qp->qp_num, "REP private data");
		} else {
			got_server = ev->id == sv;
		}
		rdma_ack_cm_event(ev);
	}
	EXPECT(got_client && got_server, "both sides ESTABLISHED");
	/* one SEND each way over the QPs the CM connected */
	snprintf(cc.buf, 64, "ping");
	struct ibv_sge sg = { .addr = (uintptr_t)cc.buf, .length = 5, .lkey = cc.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 9, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	struct ibv_wc wc;
	EXPECT(ibv_post_send(cl->qp, &wr, &bad) == 0, "post");
	EXPECT(poll_one(sv->recv_cq, &wc, WAIT_MS) && wc.status == IBV_WC_SUCCESS && !strcmp(sc.buf + 2048, "ping"),
	       "loopback SEND");
	EXPECT(poll_one(cl->send_cq, &wc, WAIT_MS) && wc.status == IBV_WC_SUCCESS, "send completion");
	OUT("LOOPBACK_CONNECTION ok");
	/* disconnect from the passive side: DREQ -> the active side's DISCONNECTED;
	 * its rdma_disconnect answers with the DREP -> the passive side's */
	EXPECT(rdma_disconnect(sv) == 0, "disconnect");
	ev = expect_event(ch, RDMA_CM_EVENT_DISCONNECTED);
	EXPECT(ev->id == cl && ev->status == 0, "DREQ: DISCONNECTED on %p status %d", (void *)ev->id, ev->status);
	rdma_ack_cm_event(ev);
	EXPECT(rdma_disconnect(cl) == 0, "disconnect answer");
	ev = expect_event(ch, RDMA_CM_EVENT_DISCONNECTED);
	EXPECT(ev->id == sv && ev->status == 0, "DREP: DISCONNECTED on %p status %d", (void *)ev->id, ev->status);
	rdma_ack_cm_event(ev);
	OUT("DISCONNECT ok");
	destroy_conn(cl, &cc);
	destroy_conn(sv, &sc);
	rdma_destroy_id(cl);
	rdma_destroy_id(sv);
	rdma_destroy_id(l);
	/* a sync (channel-less) connect to a port nobody listens on: ECONNREFUSED */
	struct rdma_cm_id *s;
	EXPECT(rdma_create_id(NULL, &s, NULL, RDMA_PS_TCP) == 0, "sync id");
	EXPECT(rdma_resolve_addr(s, NULL, (struct sockaddr *)&d, 1000) == 0 && rdma_resolve_route(s, 1000) == 0,
	       "sync resolve");
	struct rdma_conn_param np = { .responder_resources = 1, .initiator_depth = 1, .qp_num = 7 };
	EXPECT(rdma_connect(s, &np) == -1 && errno == ECONNREFUSED && s->event &&
		       s->event->event == RDMA_CM_EVENT_REJECTED && s->event->status == 8, "sync connect to no listener");
	rdma_destroy_id(s);
	OUT("SYNC_NO_LISTENER ok");
	rdma_destroy_event_channel(ch);
}

/* AF_IB addresses (the node's GID, RDMA_PS_IB) and the QP-less handshake:
 * CONNECT_RESPONSE, then rdma_establish sends the RTU. */
static void checks_af_ib(void)
{
	int n = 0;
	struct ibv_context **d = rdma_get_devices(&n);
	union ibv_gid gid;
	if (!d || n < 1 || ibv_query_gid(d[0], 1, 0, &gid))
		DIE("no device/GID");
	rdma_free_devices(d);
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *l, *a;
	EXPECT(rdma_create_id(ch, &l, NULL, RDMA_PS_IB) == 0 && rdma_create_id(ch, &a, NULL, RDMA_PS_IB) == 0, "ids");
	struct sockaddr_ib sib = { .sib_family = AF_IB, .sib_pkey = htobe16(0xffff) };
	memcpy(sib.sib_addr.sib_raw, gid.raw, 16);
	sib.sib_sid = htobe64(((uint64_t)RDMA_PS_IB << 16) | 4791);
	sib.sib_sid_mask = htobe64(RDMA_IB_IP_PS_MASK | RDMA_IB_IP_PORT_MASK);
	EXPECT(rdma_bind_addr(l, (struct sockaddr *)&sib) == 0 && l->verbs && ntohs(rdma_get_src_port(l)) == 4791 &&
		       rdma_listen(l, 1) == 0, "AF_IB listen: %s", strerror(errno));
	EXPECT(rdma_resolve_addr(a, NULL, (struct sockaddr *)&sib, 1000) == 0, "AF_IB resolve");
	rdma_ack_cm_event(expect_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	EXPECT(a->route.addr.src_addr.sa_family == AF_IB && a->verbs, "AF_IB source");
	EXPECT(rdma_resolve_route(a, 1000) == 0, "AF_IB route");
	rdma_ack_cm_event(expect_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	char pd[92] = "ib-hello";
	struct rdma_conn_param cp = { .private_data = pd, .private_data_len = 92, .responder_resources = 1,
				      .initiator_depth = 1, .qp_num = 0x77, .rnr_retry_count = 7 };
	EXPECT(rdma_connect(a, &cp) == 0, "AF_IB connect with 92 bytes: %s", strerror(errno));
	struct rdma_cm_event *ev = expect_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	struct rdma_cm_id *c = ev->id;
	EXPECT(ev->param.conn.private_data_len == 92 && !strcmp(ev->param.conn.private_data, "ib-hello") &&
		       ev->param.conn.qp_num == 0x77 && rdma_get_peer_addr(c)->sa_family == AF_IB, "AF_IB request");
	rdma_ack_cm_event(ev);
	struct rdma_conn_param sp = { .responder_resources = 1, .initiator_depth = 1, .qp_num = 0x88 };
	EXPECT(rdma_accept(c, &sp) == 0, "accept without a QP: %s", strerror(errno));
	ev = expect_event(ch, RDMA_CM_EVENT_CONNECT_RESPONSE);   /* no QP on the id: no RTU yet */
	EXPECT(ev->id == a && ev->param.conn.qp_num == 0x88, "CONNECT_RESPONSE");
	rdma_ack_cm_event(ev);
	EXPECT(rdma_establish(a) == 0, "rdma_establish: %s", strerror(errno));
	ev = expect_event(ch, RDMA_CM_EVENT_ESTABLISHED);
	EXPECT(ev->id == c, "passive ESTABLISHED after rdma_establish");
	rdma_ack_cm_event(ev);
	EXPECT(rdma_disconnect(a) == 0, "disconnect");
	ev = expect_event(ch, RDMA_CM_EVENT_DISCONNECTED);
	EXPECT(ev->id == c, "DISCONNECTED on the passive side");
	rdma_ack_cm_event(ev);
	EXPECT(rdma_disconnect(c) == 0, "answer");
	ev = expect_event(ch, RDMA_CM_EVENT_DISCONNECTED);
	EXPECT(ev->id == a && ev->status == 0, "DISCONNECTED on the active side");
	rdma_ack_cm_event(ev);
	rdma_destroy_id(c);
	rdma_destroy_id(a);
	rdma_destroy_id(l);
	rdma_destroy_event_channel(ch);
	OUT("AF_IB ok");
}

/* rdma_create_ep / rdma_get_request: the synchronous endpoint API (the
 * passive side in a thread: every call blocks until its event). */
struct ep_server { struct rdma_cm_id *listen; int rc; char pdata[64]; };

static void *ep_server_main(void *arg)
{
	struct ep_server *s = arg;
	struct rdma_cm_id *id;
	s->rc = -1;
	if (rdma_get_request(s->listen, &id)) {
		printf("FAIL rdma_get_request: %s\n", strerror(errno));
		return NULL;
	}
	pdata_str(id->event->param.conn.private_data, id->event->param.conn.private_data_len, s->pdata,
		  sizeof s->pdata);
	struct rdma_conn_param cp = { .private_data = SERVER_PDATA, .private_data_len = sizeof SERVER_PDATA,
				      .responder_resources = 1, .initiator_depth = 1, .rnr_retry_count = 7 };
	if (!id->qp || rdma_accept(id, &cp)) {   /* the QP comes from the listener's rdma_create_ep */
		printf("FAIL accept on the request (qp %p): %s\n", (void *)id->qp, strerror(errno));
		rdma_destroy_ep(id);
		return NULL;
	}
	/* the client disconnects: a synchronous id reads DISCONNECTED in rdma_disconnect */
	s->rc = rdma_disconnect(id);
	rdma_destroy_ep(id);
	return NULL;
}

static void checks_endpoints(void)
{
	char me[32], port[16];
	own_loopback(me, sizeof me);
	struct rdma_addrinfo hints = { .ai_flags = RAI_PASSIVE, .ai_port_space = RDMA_PS_TCP }, *res;
	EXPECT(rdma_getaddrinfo(me, "0", &hints, &res) == 0, "getaddrinfo passive");
	struct ibv_qp_init_attr attr = { .qp_type = IBV_QPT_RC, .sq_sig_all = 1,
					 .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ep_server srv = { 0 };
	EXPECT(rdma_create_ep(&srv.listen, res, NULL, &attr) == 0 && rdma_listen(srv.listen, 2) == 0, "passive ep: %s",
	       strerror(errno));
	rdma_freeaddrinfo(res);
	snprintf(port, sizeof port, "%u", ntohs(rdma_get_src_port(srv.listen)));
	pthread_t t;
	pthread_create(&t, NULL, ep_server_main, &srv);
	struct rdma_addrinfo h2 = { .ai_port_space = RDMA_PS_TCP };
	res = NULL;
	EXPECT(rdma_getaddrinfo(me, port, &h2, &res) == 0, "getaddrinfo active");
	struct rdma_cm_id *cl = NULL;
	EXPECT(res && rdma_create_ep(&cl, res, NULL, &attr) == 0 && cl->qp, "active ep: %s", strerror(errno));
	rdma_freeaddrinfo(res);
	struct rdma_conn_param cp = { .private_data = CLIENT_PDATA, .private_data_len = sizeof CLIENT_PDATA,
				      .responder_resources = 1, .initiator_depth = 1, .retry_count = 7, .rnr_retry_count = 7 };
	EXPECT(cl && rdma_connect(cl, &cp) == 0 && cl->event && cl->event->event == RDMA_CM_EVENT_ESTABLISHED &&
		       !strcmp(cl->event->param.conn.private_data, SERVER_PDATA), "sync connect: %s", strerror(errno));
	EXPECT(cl && rdma_disconnect(cl) == 0 && cl->event && cl->event->event == RDMA_CM_EVENT_DISCONNECTED,
	       "sync disconnect: %s", strerror(errno));
	pthread_join(t, NULL);
	EXPECT(srv.rc == 0 && !strcmp(srv.pdata, CLIENT_PDATA), "passive side rc %d pdata '%s'", srv.rc, srv.pdata);
	if (cl)
		rdma_destroy_ep(cl);
	rdma_destroy_ep(srv.listen);
	OUT("ENDPOINTS ok");
}

/* Does the emulated HCA make UD QPs? (tests skip the UD paths when it does not) */
static int ud_probe(void)
{
	char me[32];
	own_loopback(me, sizeof me);
	struct rdma_cm_id *id;
	struct sockaddr_in a = addr_of(me, 0);
	if (rdma_create_id(NULL, &id, NULL, RDMA_PS_UDP) || rdma_bind_addr(id, (struct sockaddr *)&a))
		DIE("UD id: %s", strerror(errno));
	struct ibv_qp_init_attr ia = { .qp_type = IBV_QPT_UD, .cap = { .max_send_wr = 1, .max_recv_wr = 1,
								       .max_send_sge = 1, .max_recv_sge = 1 } };
	if (rdma_create_qp(id, NULL, &ia))
		OUT("UD_PROBE missing errno=%d", errno);
	else
		OUT("UD_PROBE ok");
	if (id->qp)
		rdma_destroy_qp(id);
	rdma_destroy_id(id);
	return 0;
}

static int checks(void)
{
	checks_api();
	checks_loopback();
	checks_af_ib();
	checks_endpoints();
	OUT(fails ? "RESULT FAIL %d" : "RESULT OK", fails);
	return fails ? 1 : 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc < 2)
		DIE("usage: %s server|client|checks [options]", argv[0]);
	struct opts o = { .addr = "127.0.0.1", .timeout_ms = 2000, .count = 1 };
	for (int i = 2; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--addr") && v) o.addr = argv[++i];
		else if (!strcmp(a, "--port") && v) o.port = atoi(argv[++i]);
		else if (!strcmp(a, "--timeout-ms") && v) o.timeout_ms = atoi(argv[++i]);
		else if (!strcmp(a, "--defer-accept-ms") && v) o.defer_ms = atoi(argv[++i]);
		else if (!strcmp(a, "--count") && v) o.count = atoi(argv[++i]);
		else if (!strcmp(a, "--pdata-len") && v) o.pdata_len = atoi(argv[++i]);
		else if (!strcmp(a, "--ud")) o.ud = 1;
		else if (!strcmp(a, "--ud-qp")) o.ud = o.ud_qp = 1;
		else if (!strcmp(a, "--sync")) o.sync = 1;
		else if (!strcmp(a, "--reject")) o.reject = 1;
		else if (!strcmp(a, "--hold")) o.hold = 1;
		else if (!strcmp(a, "--hold-established")) o.hold_established = 1;
		else if (!strcmp(a, "--disconnect")) o.disconnect = 1;
		else if (!strcmp(a, "--wait-disconnect")) o.wait_disconnect = 1;
		else DIE("unknown option %s", a);
	}
	if (!strcmp(argv[1], "server"))
		return server(&o);
	if (!strcmp(argv[1], "client"))
		return client(&o);
	if (!strcmp(argv[1], "checks"))
		return checks();
	if (!strcmp(argv[1], "ud-probe"))
		return ud_probe();
	DIE("unknown mode %s", argv[1]);
}
