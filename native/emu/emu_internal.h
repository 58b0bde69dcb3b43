/* Internal definitions of the sigmatrace emulated mlx5 HCA (test-only): the
 * one private header of libibverbs.so.1 and libmlx5.so.1 of native/emu.
 * See docs/emulator.md for the design and the source layout. */
#ifndef ST_EMU_INTERNAL_H
#define ST_EMU_INTERNAL_H

#include <errno.h>
#include <infiniband/verbs.h>
#include <infiniband/mlx5dv.h> /* rdma-core's struct mlx5_wqe_av (UD address vectors, ref §1.8) */
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
#define EMU_MAX_PD      16384           /* PD numbers 1..EMU_MAX_PD-1 (the PRM pd field is 24 bits; the
                                          * recorder test holds 7,000 PDs at once) */
#define EMU_PKT_MAX     65536u          /* payload bytes per fabric packet */
#define EMU_RING_BYTES  (8u << 20)      /* inbox ring size per node */
#define EMU_OUTQ_LIMIT  (4u << 20)      /* requester back-pressure per peer */

/* SIGMATRACE_EMU_DEBUG: 0/unset off, "errors" the NIC's error reports only
 * (EMU_ERR: refused doorbells, BlueFlame mismatches), anything else all */
extern int emu_debug;
#define EMU_PRINT(...) do { fprintf(stderr, "[st-emu %d] ", (int)getpid()); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } while (0)
#define EMU_LOG(...) do { if (emu_debug >= 2) EMU_PRINT(__VA_ARGS__); } while (0)
#define EMU_ERR(...) do { if (emu_debug >= 1) EMU_PRINT(__VA_ARGS__); } while (0)

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
	PKT_UD_SEND,     /* one UD datagram (unreliable: no answer); GRH fields in swap_add/compare */
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
	uint32_t syndrome;  /* NAK; PKT_UD_SEND: the Q_Key */
	/* atomic operands as in the WQE (FA: add; CS: swap, compare); an
	 * ATOMIC_RESP carries the original value in swap_add */
	uint64_t swap_add, compare;
	uint8_t  op;        /* mlx5 opcode of the request */
	uint8_t  grh;       /* PKT_UD_SEND: the datagram carries a GRH (sgid, dgid below) */
	uint8_t  opmod;     /* ATOMIC_REQ: the ctrl opmod (0x08/0x09 extended atomics) */
	uint8_t  asize;     /* ATOMIC_REQ: operand bytes, 4 or 8 */
	uint8_t  dc;        /* request from a DCI: dc_key below is the DC access key */
	uint8_t  pad[3];
	uint64_t mask_a, mask_b; /* masked atomics: swap mask or field boundary, compare mask */
	uint64_t dc_key;
	uint8_t  sgid[16], dgid[16]; /* PKT_UD_SEND with grh */
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

struct emu_uar;
struct emu_context {
	struct verbs_context vctx;
	struct emu_nic *nic;
	int async_wfd;           /* write end of async_fd's pipe: the events the NIC raises */
	struct emu_uar *cq_uar;  /* page of this context's CQ arm doorbells (UAR + 0x20), on first init_obj(CQ) */
};

struct emu_ah {             /* an address handle: the mlx5 AV that UD WQEs carry (ref §1.8) */
	struct ibv_ah ah;
	struct mlx5_wqe_av av;
	int is_global;
};

/* A protection domain, or a parent domain (ibv_alloc_parent_domain, pd.c):
 * a parent domain names its protection domain (parent) and may carry the
 * application's buffer allocators, which the objects created on it use. */
struct emu_pd {
	struct ibv_pd pd;
	uint32_t pdn;
	struct emu_pd *parent;   /* parent domain: the protection domain; NULL for a PD */
	void *(*alloc)(struct ibv_pd *pd, void *pd_context, size_t size, size_t alignment, uint64_t resource_type);
	void (*free)(struct ibv_pd *pd, void *pd_context, void *ptr, uint64_t resource_type);
	void *pd_context;
	int refs;                /* objects created on this (parent) domain */
};
/* A buffer of an object: from a parent domain's allocator or the emulator's own. */
struct emu_buf { void *ptr; size_t size; struct emu_pd *pd; uint64_t type; };
struct emu_channel { struct ibv_comp_channel ch; int wfd; };

struct emu_mr {
	struct ibv_mr mr;
	uint64_t addr;    /* iova = addr */
	size_t len;
	int access;
	uint32_t pdn;
	int valid;
	int gpu;          /* GPU memory: the NIC copies it through CUDA (dma.c) */
	int dmabuf_fd;    /* ibv_reg_dmabuf_mr: the fd (the application's), else -1 */
};

struct emu_umem {   /* mlx5dv_devx_umem must be first */
	uint32_t umem_id;
	struct emu_nic *nic;
	void *addr;
	size_t size;
	int valid;
	int gpu;          /* GPU memory (dma.c) */
};

struct emu_uar {    /* a UAR page the NIC watches */
	struct emu_uar *next;
	uint8_t *page;
	uint32_t page_id;
	uint64_t last[4];     /* last value seen at 0x800 + i*0x100 */
	int devx;             /* polled: 4 doorbell registers 0x800..0xb00 (DevX, or handed out by init_obj) */
	int cq_page;          /* a context's CQ UAR: only the arm doorbell at 0x20 is sampled */
	uint64_t last_arm;    /* last value seen at 0x20 */
	uint8_t bf_seen[4][256]; /* the BlueFlame bytes seen at the last doorbell on each register (doorbell.c) */
	int refs;             /* verbs QPs sharing it (SIGMATRACE_EMU_BFREG), else 1 */
	void *devx_obj;       /* struct mlx5dv_devx_uar handed out */
	/* SIGMATRACE_EMU_BF_POST: which half of each bfreg (index (bf_off >> 9) & 3) ibv_post_send rings
	 * next, as rdma-core's bf->offset, shared by the QPs on it; bf_lock serialises them when shared */
	uint8_t bf_half[4];
	pthread_spinlock_t bf_lock;
	uint64_t bf_written[4][32]; /* the last copy ibv_post_send wrote at each register (8-byte atomics) */
};

struct emu_cq {
	union {               /* must be first: ibv_cq_ex starts like ibv_cq */
		struct ibv_cq cq;
		struct ibv_cq_ex cqx;
	};
	uint32_t cqn;
	uint8_t *buf;         /* ncqe slots of cqe_size bytes; the 64-byte CQE is a slot's last 64 bytes */
	uint32_t ncqe;
	uint32_t cqe_size;    /* 64 or 128 (mlx5dv_create_cq) */
	int ignore_overrun;   /* IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN */
	struct ibv_wc xwc;    /* ibv_cq_ex lazy polling: the current completion */
	volatile uint32_t *dbrec; /* [0] set_ci, [1] arm */
	uint32_t pi;          /* NIC producer index */
	uint32_t ci;          /* consumer (poll_cq) */
	int collapsed;
	int devx;
	int dv_owned;         /* mlx5dv_init_obj gave the ring to the application: it polls and sets the CI itself */
	int armed, arm_sol;
	pthread_mutex_t lock; /* NIC write vs arm */
	pthread_spinlock_t poll_lock;
	uint32_t events;      /* events signalled */
	int own_buf;
	uint8_t dbr_storage[64];
	struct emu_buf cbuf, dbuf; /* ring and doorbell record from a parent domain's allocator (pd.c) */
};

/* An SRQ in mlx5 layout: WQEs of a 16-byte next segment (next_wqe_index at
 * byte 2, BE16) and data segments, linked into a list; the doorbell record
 * counts the WQEs posted.  The NIC consumes from its head, following the
 * links, so a library that relinks WQEs (UCX's SRQ_TOPO=list) works. */
struct emu_srq {
	struct ibv_srq srq;
	uint32_t srqn;
	uint8_t *buf;
	uint32_t wqe_cnt, stride, max_sge;
	uint64_t *wrid;
	volatile uint32_t *dbrec;   /* [0] = BE32 count of WQEs posted */
	uint32_t head, tail;        /* application (rdma-core): next WQE to post, last free WQE */
	uint16_t counter;           /* application: WQEs posted */
	uint32_t nic_head;          /* NIC: next WQE to take */
	uint16_t nic_count;         /* NIC: WQEs taken */
	uint32_t limit;
	pthread_spinlock_t plock;
	uint8_t dbr_storage[64];
	struct emu_buf sbuf, dbuf; /* ring and doorbell record from a parent domain's allocator (pd.c) */
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

/* A BlueFlame copy the NIC took for the WQE at idx (doorbell.c), executed
 * instead of the SQ's bytes for its first len bytes. */
struct emu_bf_snap { uint16_t idx, len; int valid; uint8_t b[256]; };
#define EMU_BF_SNAPS 4

/* One async event in a context's pipe (async.c): the event, and for a QP event the QP's number and
 * registration, so that one of a QP destroyed meanwhile is not delivered. */
struct emu_async_rec {
	struct ibv_async_event ev;
	uint32_t qpn;
	uint32_t pad;
	uint64_t serial; /* 0: not a QP event */
};

struct emu_qp {
	struct ibv_qp_ex qpx;      /* qp_base first */
	struct emu_nic *nic;
	uint32_t qpn;
	uint64_t serial;           /* this QP's registration among the NIC's (async events name it, async.c) */
	uint32_t async_reported;   /* its async events handed to the application (destroy waits for their acks) */
	uint32_t bf_off;           /* its doorbell register in the UAR page (0x800, 0xa00 when shared) */
	uint32_t bf_size;          /* 256 once mlx5dv_init_obj handed out BlueFlame registers, else 0 */
	uint32_t sq_rung;          /* sq_pi when ibv_post_send last rang (SIGMATRACE_EMU_BF_POST: one WQE since -> a copy) */
	int devx;
	int qp_type;               /* IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD, EMU_QPT_DCI, EMU_QPT_DCT */
	uint32_t user_index;       /* qpc.user_index: CQE srqn_uidx with cqe_version 1 (DevX) */
	uint32_t pdn;
	uint8_t atomic_mode;       /* qpc.atomic_mode (DevX; verbs QPs: UP_TO_8B) */
	uint8_t pm_state, counter_set_id, log_rra_max, log_sra_max, log_msg_max, sl, log_ack_req_freq;
	uint16_t pkey_index;
	uint64_t dc_key;           /* DCI: qpc.dc_access_key; DCT: the key initiators must present */
	uint32_t fence_seen;       /* sq_exec + 1 of the last fenced WQE counted as waiting */
	struct emu_buf qbuf, dbuf; /* WQ buffer and doorbell record from a parent domain's allocator */
	uint32_t qkey;             /* UD */
	/* doorbell checks (doorbell.c): the last producer index rung on each of
	 * the page's registers 0x800 + 0x100 * r, valid where bit r of db_seen */
	uint16_t db_last[4];
	uint8_t db_seen;
	struct emu_bf_snap bf_snap[EMU_BF_SNAPS];
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

/* What the NIC counts (SIGMATRACE_EMU_STATS writes them at exit):
 * X(name, meaning) */
#define EMU_STATS(X)                                                                          \
	X(doorbells, "doorbell register values sampled")                                     \
	X(db_ignored, "doorbells for no QP or a QP not yet in RTS")                          \
	X(db_stale_pi, "doorbells whose producer index is behind the one rung before on that register") \
	X(db_pi_overrun, "doorbells whose producer index is more than the ring ahead of the QP") \
	X(bf_copies, "BlueFlame copies that agreed with the SQ, executed from the copy")     \
	X(bf_mismatch, "BlueFlame copies that differed from the SQ (the copy is executed)")  \
	X(bf_superseded, "BlueFlame registers overwritten by a later doorbell before checked") \
	X(db_only, "8-byte doorbells on a BlueFlame register (no copy: executed from the SQ)") \
	X(bf_posted, "BlueFlame copies ibv_post_send wrote (SIGMATRACE_EMU_BF_POST)")                \
	X(bf_torn, "BlueFlame copies another write landed inside (a NIC would execute a torn WQE)") \
	X(cq_arms, "CQ arm doorbells (UAR + 0x20)")                                          \
	X(async_events, "async events raised")                                               \
	X(async_events_dropped, "async events of QPs destroyed before they were read (not delivered)") \
	X(ud_sent, "UD datagrams sent")                                                      \
	X(ud_received, "UD datagrams received")                                              \
	X(ud_dropped, "UD datagrams dropped (no QP, Q_Key mismatch, no receive WQE)")                 \
	X(wqe_bad_opcode, "send WQEs the HCA refused (unknown opcode, opmod or QP type): LOCAL_QP_OP_ERR CQE") \
	X(wqe_fenced, "fenced WQEs that waited for earlier RDMA READs/atomics to complete")      \
	X(atomic_refused, "atomics NAKed by the responder (alignment, QP atomic_mode)")            \
	X(dc_key_violations, "DC requests whose DC access key did not match the DCT's")           \
	X(dma_gpu_copies, "NIC copies of GPU memory through CUDA (dma.c)")                         \
	X(dma_gpu_errors, "NIC copies of GPU memory that failed")
struct emu_stats {
#define EMU_STAT_FIELD(name, what) uint64_t name;
	EMU_STATS(EMU_STAT_FIELD)
#undef EMU_STAT_FIELD
	/* the ground truth a trace is checked against: send-queue WQEs executed, per mlx5 opcode (ref §1.2;
	 * 5 bits), with their payload bytes (atomics: 8), and receive WQEs consumed by incoming messages */
	uint64_t wqes_by_opcode[64];
	uint64_t bytes_by_opcode[64];
	uint64_t recvs_consumed;
};

struct emu_nic {
	pthread_mutex_t lock;
	pthread_t thread;
	volatile int running;
	int refcnt;
	int busy_poll;   /* SIGMATRACE_EMU_NIC_SPIN: never sleep when idle */
	uint64_t watchdog_ns;   /* SIGMATRACE_EMU_WATCHDOG_MS: dump the NIC's state after this long without progress */
	uint64_t last_work_ns;  /* when the NIC last made progress (watchdog) */
	uint64_t progress;      /* its signature: doorbells, WQEs executed, messages served */
	uint64_t work_by_source[4]; /* loop rounds that found work: UAR scan, inbox, QP service, node flush */
	int watchdog_dumped;    /* this stall was dumped already */
	pthread_t watchdog;     /* its own thread: it sees a NIC thread stuck inside a round too */
	volatile int phase;     /* where the NIC thread is: 0 idle, 1 UAR scan, 2 inbox, 3 QP service, 4 node flush */
	volatile uint64_t rounds; /* NIC loop rounds */
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
	/* every MR registered in this run, deregistered ones too, for the stats file (ground truth of the keys
	 * a trace's remote accesses name); the first 64 of them */
	struct emu_mr_log { uint32_t rkey; int gpu; uint64_t addr; size_t len; } mr_log[64];
	int mr_log_n;
	struct emu_umem *umems[EMU_MAX_UMEM];
	struct emu_srq *srqs[256];
	struct emu_uar *uars;
	struct emu_qp *qlist[EMU_MAX_QP]; int nq;
	uint32_t next_pdn, next_uar_id;
	uint8_t pd_live[EMU_MAX_PD]; /* PD numbers allocated (verbs or DevX ALLOC_PD), checked by DevX commands */
	int dc_enabled;  /* SIGMATRACE_EMU_DC: DCT/DCI objects exist (mlx5dv_create_qp DCT, DevX DCI/DCT, hca_cap.dct) */
	int dmabuf_enabled; /* SIGMATRACE_EMU_DMABUF: ibv_reg_dmabuf_mr registers (else EOPNOTSUPP) */
	int have_devx_uars;
	uint64_t last_liveness_ns;
	int bf_enabled;  /* SIGMATRACE_EMU_BF (default 1): init_obj(QP) reports bf.size 256 */
	int bf_post;     /* SIGMATRACE_EMU_BF_POST: ibv_post_send rings like rdma-core's mlx5 (post.c) */
	uint64_t bf_burst_ns; /* SIGMATRACE_EMU_BF_BURST_NS: such a copy's 8-byte stores spread over this long */
	char stats_path[256]; /* SIGMATRACE_EMU_STATS */
	struct emu_stats *stats; /* the process's counters (they outlive a released NIC) */
};

/* QP types beyond ibv_qp_type (mlx5 DC): a DC initiator (DevX CREATE_QP st
 * DCI) and a DC target (mlx5dv_create_qp DCT, DevX CREATE_DCT). */
#define EMU_QPT_DCI 0x105
#define EMU_QPT_DCT 0x106

/* An atomic operation (amo.c): opcode, opmod, operand bytes; a = swap/add,
 * b = compare, am = swap mask / field boundary, bm = compare mask. */
struct emu_amo { uint8_t op, opmod, size; uint64_t a, b, am, bm; };

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
/* len bytes of qp's SQ from WQEBB idx on, as the NIC reads them (the ring wraps) */
void emu_sq_bytes(const struct emu_qp *qp, uint32_t idx, uint8_t *dst, uint32_t len);
void emu_identity(char *name, size_t n, uint64_t *guid, uint32_t *lid, uint8_t gid[16]);
const struct emu_nic *emu_config(void);
void emu_stats_write(struct emu_nic *nic);
void emu_count_wqe(struct emu_nic *nic, uint32_t opcode, uint64_t bytes);

/* sysfs.c */
void emu_sysfs_paths(char *ibdev_path, size_t n1, char *dev_path, size_t n2);

/* async.c */
void emu_async_event(struct ibv_context *c, enum ibv_event_type type, void *element);
void emu_qp_wait_async_acks(struct emu_qp *qp, uint32_t reported);

/* fabric.c */
struct emu_gather { const uint8_t *data; uint32_t len; }; /* a piece of a packet's payload */
long emu_futex(volatile uint32_t *addr, int op, uint32_t val, const struct timespec *ts);
void emu_nic_kick(struct emu_nic *nic);
int emu_inbox_create(struct emu_nic *nic);
struct emu_node *emu_node_by_lid(struct emu_nic *nic, uint32_t lid);
struct emu_node *emu_node_by_gid(struct emu_nic *nic, const uint8_t gid[16]);
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
void emu_cq_arm(struct emu_cq *cq, int solicited, uint32_t ci); /* cq.c: arm, fire now if due */
static inline struct st_mlx5_cqe64 *emu_cqe_at(struct emu_cq *cq, uint32_t i)
{
	return (struct st_mlx5_cqe64 *)(cq->buf + (size_t)(i & (cq->ncqe - 1)) * cq->cqe_size + (cq->cqe_size - 64));
}
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
void emu_ud_rx(struct emu_nic *nic, const struct emu_pkt *p);
int emu_srq_take(struct emu_srq *s, uint32_t *wqe); /* srq.c (NIC): 0 and the WQE index, or -1 */

/* doorbell.c */
int emu_scan_uars(struct emu_nic *nic);

/* dma.c: the NIC's accesses of registered memory; GPU memory through CUDA */
int emu_devmem_register(uint64_t addr, uint64_t len);  /* 1 GPU memory, 0 host, -1 table full */
void emu_devmem_unregister(uint64_t addr, uint64_t len);
int emu_dma_is_device(uint64_t addr, size_t n);
int emu_dma_read(void *dst, uint64_t src, size_t n);   /* 0, or -1: a GPU copy failed */
int emu_dma_write(uint64_t dst, const void *src, size_t n);
uint32_t emu_dma_load_be32(const volatile uint32_t *p);
int emu_dma_in_progress(uint64_t *addr);
void emu_dma_counts(uint64_t *copies, uint64_t *errors);

/* amo.c */
int emu_amo_apply(const struct emu_amo *o, uint64_t addr, uint64_t *orig);
int emu_amo_parse(const uint8_t *w, uint32_t off, uint32_t ds, uint32_t opcode, uint32_t opmod,
		  struct emu_amo *o, const struct st_mlx5_wqe_data_seg **data);

/* pd.c */
struct emu_pd *emu_pd_of(struct ibv_pd *pd);         /* the protection domain (a parent domain's parent) */
uint32_t emu_pd_num(struct ibv_pd *pd);             /* its PD number */
int emu_pd_alive(struct emu_nic *nic, uint32_t pdn); /* atomic: no lock needed */
uint32_t emu_pd_alloc_num(struct emu_nic *nic);      /* atomic; 0 when none is left */
void emu_pd_free_num(struct emu_nic *nic, uint32_t pdn);
int emu_buf_alloc(struct emu_buf *b, struct ibv_pd *pd, size_t size, size_t align, uint64_t type);
void emu_buf_free(struct emu_buf *b);
uint8_t *emu_ring_alloc(struct emu_buf *ring, struct emu_buf *dbr, struct ibv_pd *pd, size_t bytes, uint64_t type);
void emu_ring_free(struct emu_buf *ring, struct emu_buf *dbr, uint8_t *own);
struct ibv_pd *emu_alloc_parent_domain(struct ibv_context *c, struct ibv_parent_domain_init_attr *a);

/* dct.c: DC targets (verbs mlx5dv_create_qp DCT) */
struct emu_qp *emu_dct_new(struct emu_nic *nic, struct ibv_context *c, struct emu_srq *srq, struct emu_cq *rcq,
			   uint64_t key, uint32_t pdn, int devx);
struct ibv_qp *emu_dct_create(struct ibv_context *c, struct ibv_qp_init_attr_ex *a, uint64_t access_key);
int emu_dct_modify(struct emu_qp *qp, struct ibv_qp_attr *attr, int mask);

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
void emu_cq_clean(struct emu_cq *cq, uint32_t qpn, struct emu_srq *srq); /* cq.c; NIC lock held */
struct ibv_qp *emu_create_qp_ex(struct ibv_context *c, struct ibv_qp_init_attr_ex *a);        /* qp.c */
struct ibv_srq *emu_create_srq_ex(struct ibv_context *c, struct ibv_srq_init_attr_ex *a);     /* srq.c */

/* verbs helpers shared with devx */
void emu_qp_init_ex_ops(struct emu_qp *qp);                          /* post.c */
int emu_qp_modify_state(struct emu_qp *qp, int cur, int new_state); /* qp.c, validates */
const char *emu_state_name(int s);                                  /* qp.c */

#endif
