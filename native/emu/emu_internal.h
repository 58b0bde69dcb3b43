/* Internal definitions of the sigmatrace emulated mlx5 HCA (test-only): the
 * one private header of libibverbs.so.1 and libmlx5.so.1 of native/emu.
 * See docs/emulator.md for the design and the source layout. */
#ifndef ST_EMU_INTERNAL_H
#define ST_EMU_INTERNAL_H

#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "sigmatrace/mlx5.h"

#define EXPORT __attribute__((visibility("default")))

/* The NIC thread plays the device: its reads and writes of host memory (SQ, CQ, data buffers, UAR pages
 * sampled for doorbells) are DMA, ordered by doorbells, barriers and ownership bits as on real hardware —
 * synchronisation a thread sanitizer cannot see.  Under ThreadSanitizer the NIC thread's memory accesses
 * are therefore ignored (its locks are still tracked), so races among the program's and the tracer's own
 * threads are the ones reported. */
#if defined(__SANITIZE_THREAD__)
void __tsan_ignore_thread_begin(void); /* in the runtime; not in every compiler's tsan_interface.h */
void __tsan_ignore_thread_end(void);
#define EMU_DEVICE_THREAD() __tsan_ignore_thread_begin()
#define EMU_DEVICE_THREAD_END() __tsan_ignore_thread_end()
#else
#define EMU_DEVICE_THREAD() ((void)0)
#define EMU_DEVICE_THREAD_END() ((void)0)
#endif

#define EMU_MAX_QP      4096
#define EMU_QPN_BASE    0x100
#define EMU_MAX_MR      16384
#define EMU_MAX_CQ      4096
#define EMU_MAX_UMEM    4096
#define EMU_MAX_SGE     16
#define EMU_MAX_INLINE  512
#define EMU_MAX_NODES   64
#define EMU_PKT_MAX     65536u          /* payload bytes per fabric packet */
#define EMU_RING_BYTES  (8u << 20)      /* inbox ring size per node */
#define EMU_OUTQ_LIMIT  (4u << 20)      /* requester back-pressure per peer */

extern int emu_debug;
#define EMU_LOG(...) do { if (emu_debug) { fprintf(stderr, "[st-emu %d] ", (int)getpid()); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

/* ---- shared-memory fabric ------------------------------------------------ */
#define EMU_INBOX_MAGIC 0x53544d55454d5531ull /* "STMUEMU1" */
struct emu_inbox_hdr {
	uint64_t magic;
	pthread_mutex_t lock;     /* process-shared, robust: producers */
	volatile uint64_t head;   /* consumer byte counter (owner NIC only) */
	volatile uint64_t tail;   /* producer byte counter */
	uint32_t size;            /* ring bytes */
	volatile uint32_t wake_seq;  /* futex word */
	volatile uint32_t sleeping;
	int32_t pid;
	uint32_t lid;
	uint8_t gid[16];
	uint64_t guid;
	char dev_name[64];
	uint8_t pad[64];
	uint8_t data[];          /* ring */
};

enum emu_pkt_type {
	PKT_PAD = 0,
	PKT_SEND,        /* chunk of a SEND (flags FIRST/LAST/IMM/INV) */
	PKT_WRITE,       /* chunk of an RDMA WRITE (LAST+IMM => consumes a recv) */
	PKT_READ_REQ,
	PKT_ATOMIC_REQ,
	PKT_ACK,
	PKT_NAK,
	PKT_READ_RESP,
	PKT_ATOMIC_RESP,
};
#define PF_FIRST 1u
#define PF_LAST  2u
#define PF_IMM   4u
#define PF_INV   8u

struct emu_pkt {
	uint32_t size;      /* total record bytes (8-aligned) */
	uint16_t type;
	uint16_t flags;
	uint32_t dst_qpn;
	uint32_t src_qpn;
	uint32_t src_lid;
	uint32_t seq;       /* requester message sequence (per QP) */
	uint64_t raddr;     /* remote address of this chunk */
	uint32_t rkey;
	uint32_t len;       /* payload bytes in this packet */
	uint32_t total;     /* message length */
	uint32_t offset;    /* offset of this chunk in the message */
	uint32_t imm;       /* raw (network order) immediate / invalidate key */
	uint32_t syndrome;  /* NAK */
	/* atomic operands as in the WQE (FA: add; CS: swap, compare); an
	 * ATOMIC_RESP carries the original value in swap_add */
	uint64_t swap_add, compare;
	uint8_t  op;        /* mlx5 opcode of the request */
	uint8_t  pad[7];
	uint8_t  payload[];
};

struct emu_outpkt { struct emu_outpkt *next; struct emu_pkt pkt; };

struct emu_node {                 /* a peer (or ourselves) on the fabric */
	uint32_t lid;
	uint8_t gid[16];
	struct emu_inbox_hdr *hdr;
	size_t map_len;
	pid_t pid;
	int dead;
	struct emu_outpkt *outq, *outq_tail;
	size_t outq_bytes;
};

/* ---- objects -------------------------------------------------------------- */
struct emu_nic;

struct emu_context {
	struct verbs_context vctx;
	struct emu_nic *nic;
};

struct emu_pd { struct ibv_pd pd; uint32_t pdn; };
struct emu_channel { struct ibv_comp_channel ch; int wfd; };

struct emu_mr {
	struct ibv_mr mr;
	uint64_t addr;    /* iova = addr */
	size_t len;
	int access;
	uint32_t pdn;
	int valid;
};

struct emu_umem {   /* mlx5dv_devx_umem must be first */
	uint32_t umem_id;
	struct emu_nic *nic;
	void *addr;
	size_t size;
	int valid;
};

struct emu_uar {    /* a UAR page the NIC watches */
	struct emu_uar *next;
	uint8_t *page;
	uint32_t page_id;
	uint64_t last[4];     /* last value seen at 0x800 + i*0x100 */
	int devx;
	int refs;             /* verbs QPs sharing it (SIGMATRACE_EMU_BFREG), else 1 */
	void *devx_obj;       /* struct mlx5dv_devx_uar handed out */
};

struct emu_cq {
	struct ibv_cq cq;     /* must be first */
	uint32_t cqn;
	uint8_t *buf;         /* ncqe x 64 B */
	uint32_t ncqe;
	volatile uint32_t *dbrec; /* [0] set_ci, [1] arm */
	uint32_t pi;          /* NIC producer index */
	uint32_t ci;          /* consumer (poll_cq) */
	int collapsed;
	int devx;
	int armed, arm_sol;
	pthread_mutex_t lock; /* NIC write vs arm */
	pthread_spinlock_t poll_lock;
	uint32_t events;      /* events signalled */
	int own_buf;
	uint8_t dbr_storage[64];
};

struct emu_srq {
	struct ibv_srq srq;
	uint32_t srqn;
	uint8_t *buf;
	uint32_t wqe_cnt, stride, max_sge;
	uint64_t *wrid;
	volatile uint32_t *dbrec;
	uint32_t pi;        /* app producer */
	uint32_t ci;        /* NIC consumer */
	uint32_t limit;
	pthread_spinlock_t plock;
	uint8_t dbr_storage[64];
};

struct emu_inflight {
	uint16_t wqe_idx;
	uint8_t opcode;
	uint8_t signaled;
	uint8_t done;
	uint8_t syndrome;  /* 0 = success */
	uint32_t seq;
	uint32_t byte_len;
	uint32_t nsge;
	struct { uint64_t addr; uint32_t len; uint32_t lkey; } sge[EMU_MAX_SGE];
	uint32_t resp_off;
};

struct emu_pending { struct emu_pending *next; struct emu_pkt pkt; };

struct emu_qp {
	struct ibv_qp_ex qpx;      /* qp_base first */
	struct emu_nic *nic;
	uint32_t qpn;
	uint32_t bf_off;           /* its doorbell register in the UAR page (0x800, 0xa00 when shared) */
	int devx;
	volatile int state;        /* enum ibv_qp_state */
	int qp_access;
	int sq_sig_all;
	/* send queue (ref §1): ring of WQEBBs */
	uint8_t *sq_buf;
	uint32_t sq_wqebb;        /* power of 2 */
	uint32_t sq_max_wqe_bb;   /* WQEBBs of the largest WQE */
	uint64_t *sq_wrid;
	uint32_t *sq_next;        /* per slot: producer index after that WQE */
	uint32_t sq_tail;         /* app view: first WQEBB not yet known complete */
	uint32_t sq_pi;           /* app producer (WQEBB counter) */
	uint32_t max_inline, max_send_sge, max_send_wr;
	pthread_spinlock_t sq_lock;
	/* receive queue: ring of scatter lists */
	uint8_t *rq_buf;
	uint32_t rq_wqe_cnt, rq_stride, rq_max_sge, max_recv_wr;
	uint64_t *rq_wrid;
	uint32_t rq_pi;            /* app producer */
	uint32_t rq_tail;          /* app view: consumed by completions */
	pthread_spinlock_t rq_lock;
	volatile uint32_t *dbrec;  /* [0] RQ, [1] SQ (ref §3.1) */
	uint8_t *uar;              /* UAR page; DB register at +0x800 */
	struct emu_uar *uarobj;
	struct emu_cq *scq, *rcq;
	struct emu_srq *srq;
	uint8_t *qp_buf; int own_bufs;
	uint8_t dbr_storage[64];
	/* connection */
	uint32_t dest_qpn, dlid, sq_psn, rq_psn;
	uint8_t dgid[16]; int is_global;
	uint8_t port, timeout, retry_cnt, rnr_retry, min_rnr_timer, mtu;
	struct emu_node *peer;
	/* NIC side: requester */
	uint32_t sq_exec;          /* next WQEBB index to execute */
	uint32_t sq_announced;     /* producer index announced by doorbells */
	struct emu_inflight *inflight; /* ring: WQEs executed, not yet completed */
	uint32_t inflight_head, inflight_tail, inflight_cap;
	uint32_t next_seq;
	/* NIC side: responder */
	uint32_t rq_ci;            /* next RQ WQE to consume */
	int resp_active;           /* a multi-chunk SEND/WRITE_IMM is in progress */
	uint32_t resp_wqe;         /* recv WQE index in use */
	int resp_from_srq;
	uint32_t resp_err;         /* seq+1 of a message that already failed */
	struct emu_pending *pend, *pend_tail;
	uint64_t pend_since_ns;
	int flush_pending;
	/* wr_* (ibv_qp_ex) builder */
	struct st_mlx5_wqe_ctrl_seg *wr_ctrl;
	uint32_t wr_ds, wr_start_pi, wr_err, wr_cur_bb;
	uint8_t wr_opcode;
	int in_table;
};

struct emu_nic {
	pthread_mutex_t lock;
	pthread_t thread;
	volatile int running;
	int refcnt;
	int busy_poll;   /* SIGMATRACE_EMU_NIC_SPIN: never sleep when idle */
	/* SIGMATRACE_EMU_BFREG: verbs QPs share UAR pages like rdma-core's bfregs:
	 * "page" two QPs per page (registers 0x800 and 0xa00), "word" every QP on
	 * one register; default one page per QP */
	int bfreg_share;
	struct emu_uar *shared_uar;
	int shared_n;
	/* identity */
	char dev_name[64];
	uint64_t guid;
	uint32_t lid;
	uint8_t gid[16];
	char fabric[64];
	char shm_name[160];
	struct emu_inbox_hdr *inbox;
	struct emu_node nodes[EMU_MAX_NODES]; int nnodes;
	struct emu_node *self;
	/* objects */
	struct emu_qp *qps[EMU_MAX_QP];
	struct emu_cq *cqs[EMU_MAX_CQ];
	struct emu_mr *mrs[EMU_MAX_MR];
	struct emu_umem *umems[EMU_MAX_UMEM];
	struct emu_srq *srqs[256];
	struct emu_uar *uars;
	struct emu_qp *qlist[EMU_MAX_QP]; int nq;
	uint32_t next_pdn, next_uar_id;
	int have_devx_uars;
	uint64_t last_liveness_ns;
};

/* ---- helpers shared by the objects' calls -------------------------------- */
/* A zeroed object for a verbs call: NULL with errno ENOMEM, the way the
 * verbs that return pointers report failure. */
static inline void *emu_zalloc(size_t size)
{
	void *p = calloc(1, size);
	if (!p)
		errno = ENOMEM;
	return p;
}

/* The first free slot of an object table: tables start at 1 (0 is never a
 * handle); n when slots 1..n-1 are all taken. */
#define EMU_FREE_SLOT(table, n)                                 \
	({                                                      \
		uint32_t slot_ = 1;                             \
		while (slot_ < (uint32_t)(n) && (table)[slot_]) \
			slot_++;                                \
		slot_;                                          \
	})

/* An object table is full: drop the NIC lock and the new object, and fail
 * with ENOMEM. */
static inline void *emu_table_full(struct emu_nic *nic, void *obj)
{
	pthread_mutex_unlock(&nic->lock);
	free(obj);
	errno = ENOMEM;
	return NULL;
}

/* nic.c */
struct emu_nic *emu_nic_get(void);
void emu_nic_put(struct emu_nic *nic);
uint64_t emu_now_ns(void);
void emu_identity(char *name, size_t n, uint64_t *guid, uint32_t *lid, uint8_t gid[16]);

/* fabric.c */
struct emu_gather { const uint8_t *data; uint32_t len; }; /* a piece of a packet's payload */
long emu_futex(volatile uint32_t *addr, int op, uint32_t val, const struct timespec *ts);
void emu_nic_kick(struct emu_nic *nic);
int emu_inbox_create(struct emu_nic *nic);
struct emu_node *emu_node_by_lid(struct emu_nic *nic, uint32_t lid);
void emu_resolve_peer(struct emu_qp *qp);
/* Send one packet (header + payload gathered from g at off) to node n. */
void emu_node_send(struct emu_node *n, struct emu_pkt *hdr, const struct emu_gather *g, int ng, uint32_t off);
int emu_node_flush(struct emu_node *n);
int emu_service_inbox(struct emu_nic *nic);
void emu_liveness(struct emu_nic *nic);

/* objects.c (NIC lock held) */
struct emu_mr *emu_mr_lookup(struct emu_nic *nic, uint32_t key);
int emu_check_local(struct emu_nic *nic, uint32_t lkey, uint64_t addr, uint32_t len, int need_write);
struct emu_qp *emu_qp_lookup(struct emu_nic *nic, uint32_t qpn);
int emu_qp_register(struct emu_nic *nic, struct emu_qp *qp); /* assigns qpn */
void emu_qp_unregister(struct emu_nic *nic, struct emu_qp *qp);
int emu_cq_register(struct emu_nic *nic, struct emu_cq *cq);
struct emu_cq *emu_cq_lookup(struct emu_nic *nic, uint32_t cqn);
struct emu_uar *emu_uar_alloc(struct emu_nic *nic, int devx);
void emu_uar_free(struct emu_nic *nic, struct emu_uar *u);

/* requester.c */
void emu_cq_write(struct emu_cq *cq, const struct st_mlx5_cqe64 *cqe);
void emu_cqe_err(struct emu_cq *cq, struct emu_qp *qp, int resp, uint16_t wqe_idx, uint8_t opcode, uint8_t syndrome);
void emu_drain_inflight(struct emu_qp *qp);
void emu_qp_to_error(struct emu_qp *qp);    /* NIC lock held */
void emu_qp_reset_nic_state(struct emu_qp *qp); /* NIC lock held */
void emu_requester_rx(struct emu_nic *nic, struct emu_qp *qp, const struct emu_pkt *p);
int emu_service_qps(struct emu_nic *nic);

/* responder.c */
void emu_free_pending(struct emu_qp *qp);
void emu_flush_rq(struct emu_qp *qp);
void emu_inbox_dispatch(struct emu_nic *nic, const struct emu_pkt *p);
int emu_service_pending(struct emu_nic *nic, struct emu_qp *qp);

/* doorbell.c */
int emu_scan_uars(struct emu_nic *nic);

/* ---- verbs side ------------------------------------------------------------ */
static inline struct emu_context *to_ectx(struct ibv_context *c)
{
	return (struct emu_context *)((char *)c - offsetof(struct emu_context, vctx.context));
}
static inline struct emu_qp *to_eqp(struct ibv_qp *q) { return (struct emu_qp *)q; }
static inline struct emu_cq *to_ecq(struct ibv_cq *c) { return (struct emu_cq *)c; }

static inline uint32_t roundup_pow2(uint32_t v)
{
	uint32_t r = 1;
	while (r < v)
		r <<= 1;
	return r;
}

/* the context's ops (ibv_open_device, device.c) */
int emu_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);       /* post.c */
int emu_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);       /* post.c */
int emu_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad); /* post.c */
int emu_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);                                 /* cq.c */
int emu_req_notify_cq(struct ibv_cq *cq, int sol);                                            /* cq.c */
struct ibv_qp *emu_create_qp_ex(struct ibv_context *c, struct ibv_qp_init_attr_ex *a);        /* qp.c */
struct ibv_srq *emu_create_srq_ex(struct ibv_context *c, struct ibv_srq_init_attr_ex *a);     /* srq.c */

/* verbs helpers shared with devx */
void emu_qp_init_ex_ops(struct emu_qp *qp);                          /* post.c */
int emu_qp_modify_state(struct emu_qp *qp, int cur, int new_state); /* qp.c, validates */
const char *emu_state_name(int s);                                  /* qp.c */

#endif
