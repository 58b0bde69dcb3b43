/* Private header of the emulated librdmacm.so.1 (test-only, native/emu/rdmacm).
 *
 * The library keeps rdma-core 44's ABI (<rdma/rdma_cma.h> structures, symbol
 * versions in librdmacm.map) and runs the connection manager between the
 * processes of one emulated fabric (SIGMATRACE_EMU_FABRIC):
 *
 *   - every process that uses rdma_cm has one CM agent (agent.c): the
 *     emulated device opened once (the context rdma_get_devices returns and
 *     every id's `verbs`), a registry file naming the node's addresses, a
 *     listening unix seqpacket socket in the abstract namespace and a thread
 *     that reads the CM messages and fires the timers;
 *   - one seqpacket connection per rdma_cm connection carries the IB CM
 *     handshake (REQ, REP, RTU, REJ, DREQ, DREP; SIDR REQ/REP for UD); the
 *     kernel closing a dead process's sockets is what tells the peer;
 *   - addresses (addr.c): node LID L owns 127.0.<L/256>.<L%256>, its GID (AF_IB)
 *     and the addresses listed in SIGMATRACE_EMU_IP_ADDRS.
 *
 * docs/emulator.md ("rdma_cm") describes what is emulated and the limits.
 * One global mutex (cma.lock) guards every id, channel, event and socket. */
#ifndef ST_EMU_CMA_H
#define ST_EMU_CMA_H

#include <infiniband/ib.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

#define CMA_EXPORT __attribute__((visibility("default")))

/* private data bytes the IB CM messages carry (IBTA; the kernel's
 * IB_CM_*_PRIVATE_DATA_SIZE) and the cma header an IP-addressed REQ uses */
#define CM_REQ_PDATA      92
#define CM_REP_PDATA      196
#define CM_REJ_PDATA      148
#define CM_SIDR_REQ_PDATA 216
#define CM_SIDR_REP_PDATA 136
#define CM_IP_HDR         36

/* IB CM reject reasons and SIDR statuses used here */
#define CM_REJ_TIMEOUT          1
#define CM_REJ_INVALID_SID      8
#define CM_REJ_CONSUMER_DEFINED 28
#define CM_SIDR_UNSUPPORTED     1
#define CM_SIDR_REJECT          2

#define CM_MAX_RD_ATOMIC 16     /* the emulated device's max_qp_rd_atom */

extern int cma_debug;
uint64_t cma_now_ns(void);
#define CMA_LOG(...) do { if (cma_debug) { fprintf(stderr, "[st-emu-cm %d %.6f] ", (int)getpid(), cma_now_ns() * 1e-9); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

/* ---- wire format of one CM message (one seqpacket datagram) --------------- */
#define CMW_MAGIC 0x434d5453u   /* "STMC" */
enum cmw_type { CMW_REQ = 1, CMW_REP, CMW_RTU, CMW_REJ, CMW_DREQ, CMW_DREP, CMW_SIDR_REQ, CMW_SIDR_REP };

struct cmw_msg {
	uint32_t magic;
	uint16_t type;
	uint8_t pdlen;
	uint8_t qp_type;
	uint32_t ps;           /* port space of the REQ */
	uint32_t qpn, psn, qkey;
	uint32_t status;       /* REJ reason, SIDR REP status */
	uint32_t lid;          /* sender's LID and GID */
	uint8_t gid[16];
	uint8_t resp_res, init_depth, flow_control, retry_count, rnr_retry_count, srq, pad[2];
	struct sockaddr_storage src;  /* sender's address */
	struct sockaddr_storage dst;  /* REQ: the address the sender connects to */
	uint8_t pdata[256];
};

/* ---- objects --------------------------------------------------------------- */
struct cm_id;

struct cm_channel {
	struct rdma_event_channel ch;   /* fd: an eventfd (semaphore), one count per queued event */
	struct cm_event *head, *tail;   /* queued, not yet retrieved */
	int sync;                       /* the private channel of an id created without one */
};

struct cm_event {
	struct rdma_cm_event ev;        /* first: what the application sees */
	struct cm_event *next;
	struct cm_id *owner;            /* the id it is reported on (a listener for CONNECT_REQUEST) */
	struct cm_id *target;           /* ev.id */
	uint8_t pdata[256];
};

enum cm_state {
	CS_IDLE, CS_ADDR_QUERY, CS_ADDR_BOUND, CS_ADDR_RESOLVED, CS_ROUTE_QUERY, CS_ROUTE_RESOLVED,
	CS_LISTEN,
	CS_REQ_SENT,      /* active: REQ sent, waiting for REP/REJ */
	CS_REP_RCVD,      /* active: REP received, RTU not yet sent */
	CS_REQ_RCVD,      /* passive: CONNECT_REQUEST delivered, not yet accepted */
	CS_REP_SENT,      /* passive: accepted, waiting for RTU */
	CS_ESTABLISHED,
	CS_DREQ_SENT, CS_DREQ_RCVD,
	CS_CLOSED,        /* rejected, disconnected, timed out */
};

enum cm_timer { CT_NONE, CT_ADDR, CT_ROUTE, CT_REQ, CT_RTU, CT_DREQ };

struct cm_node {                  /* a peer found through the registry */
	uint32_t lid;
	uint8_t gid[16];
	int pid;
};

struct cm_id {
	struct rdma_cm_id id;         /* first */
	struct cm_id *next;           /* cma.ids */
	int state;
	int sync;                     /* created without a channel (ucma's "sync" ids) */
	int destroyed;                /* rdma_destroy_id called: freed when its events are acked */
	int events_out;               /* events reported on this id, not yet acked */
	int bound;                    /* holds a port in its port space */
	int reuseaddr, afonly;
	uint8_t tos, ack_timeout;
	int ack_timeout_set;
	int sock;                     /* the connection's seqpacket socket, -1 */
	int connected_once;           /* a CM connection was attempted (disconnect is valid) */
	int connect_error;            /* a CONNECT_ERROR was reported: later REJECTED/DISCONNECTED are dropped */
	struct cm_node peer;
	uint32_t remote_qpn, remote_psn, remote_qkey, local_psn;
	uint8_t resp_res, init_depth; /* negotiated as librdmacm does */
	uint8_t retry_count, rnr_retry_count, remote_rnr_retry;
	int timer;                    /* enum cm_timer */
	uint64_t deadline_ns;
	int timer_status;
	struct ibv_sa_path_rec path;
	struct ibv_qp_init_attr *ep_qp_attr;  /* rdma_create_ep on a passive id: for rdma_get_request */
	struct ibv_pd *ep_pd;
};

struct cm_pending_sock { struct cm_pending_sock *next; int fd; };

struct cma_global {
	pthread_mutex_t lock;
	int inited, init_errno;
	struct ibv_device **devs;
	struct ibv_context *ctx;
	struct ibv_pd *pd;            /* default PD of ids (id->pd) */
	uint32_t lid;
	uint8_t gid[16];
	uint64_t guid;
	char fabric[64];
	struct sockaddr_storage addrs[16];  /* owned beyond 127.0.x.y: SIGMATRACE_EMU_IP_ADDRS */
	int naddrs;
	char reg_path[256];
	int lsock;                    /* the agent's listening socket */
	int wakefd;
	pthread_t thread;
	int cm_timeout_ms;
	long sa_delay_us;            /* an SA PathRecord query's round trip (rdma_resolve_route) */
	struct cm_id *ids;
	struct cm_pending_sock *pending;
};
extern struct cma_global cma;

static inline struct cm_id *to_cid(struct rdma_cm_id *id) { return (struct cm_id *)id; }
static inline struct cm_channel *to_cch(struct rdma_event_channel *c) { return (struct cm_channel *)c; }

static inline int cma_err(int e) { errno = e; return -1; }

/* agent.c */
int cma_init(void);                        /* lazily, once; 0 or -1 with errno */
uint64_t cma_now_ns(void);
void cma_wake_agent(void);
int cma_node_lookup(const struct sockaddr *addr, struct cm_node *out); /* 0 when a live node owns addr */
int cma_agent_connect(uint32_t lid);       /* a connected, non-blocking socket to node lid's agent, or -1 */
int cma_send(int fd, struct cmw_msg *m);   /* 0 or -1 */
void cma_msg_init(struct cmw_msg *m, int type);
void cma_set_timer(struct cm_id *c, int kind, int ms, int status);
void cma_set_timer_us(struct cm_id *c, int kind, long us, int status);

/* addr.c */
socklen_t cma_addrlen(const struct sockaddr *a);
int cma_addr_is_any(const struct sockaddr *a);
int cma_addr_is_loopback(const struct sockaddr *a);
int cma_addr_equal(const struct sockaddr *a, const struct sockaddr *b); /* address part only */
uint16_t cma_addr_port(const struct sockaddr *a);                        /* host order */
void cma_addr_set_port(struct sockaddr *a, uint16_t port, int ps);
int cma_addr_owned(const struct sockaddr *a);      /* by this node */
void cma_self_addr(int family, int loopback, struct sockaddr_storage *out);
void cma_loopback_of(uint32_t lid, struct sockaddr_in *out);
int cma_parse_addr_list(const char *s);
const char *cma_addr_str(const struct sockaddr *a, char *buf, size_t n);
void cma_fill_ibaddr(struct cm_id *c);             /* route.addr.addr.ibaddr from self/peer */
void cma_fill_path(struct cm_id *c);               /* the path record of a resolved route */

/* id.c (cma.lock held unless said otherwise) */
struct cm_event *cma_event_new(struct cm_id *target, struct cm_id *owner, int type, int status);
void cma_event_post(struct cm_event *e);
void cma_queue_event(struct cm_id *c, int type, int status);
struct cm_id *cma_id_alloc(struct cm_channel *ch, void *context, enum rdma_port_space ps, enum ibv_qp_type qpt);
void cma_id_maybe_free(struct cm_id *c);
void cma_set_verbs(struct cm_id *c);
int cma_complete(struct rdma_cm_id *id);           /* sync ids: wait for the next event (no lock held) */
void cma_close_sock(struct cm_id *c);

/* conn.c (cma.lock held) */
void cma_handle_msg(int fd, const struct cmw_msg *m);
void cma_handle_eof(int fd);
void cma_timer_fired(struct cm_id *c);
void cma_destroy_conn(struct cm_id *c);            /* what destroying the id tells the peer */
int cma_process_conn_resp(struct cm_id *c);        /* active side with a QP: RTR, RTS, RTU */
int cma_modify_qp_err(struct cm_id *c);

/* qp.c */
int cma_qp_attr(struct cm_id *c, struct ibv_qp_attr *attr, int *mask); /* rdma_init_qp_attr */
int cma_modify_qp_rtr(struct cm_id *c, uint8_t resp_res);
int cma_modify_qp_rts(struct cm_id *c, uint8_t init_depth);

#endif
