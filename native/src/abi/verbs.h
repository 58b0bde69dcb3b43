/*
 * The libibverbs ABI pieces the tracer uses, declared here so that it builds without rdma-core's
 * development headers (issue 17, F27).  Layouts and values are those of rdma-core's public header
 * <infiniband/verbs.h> as of rdma-core v44 (Debian 12's libibverbs-dev 44.0); nothing here is
 * rdma-core's code.  tests/test_abi_conformance.py checks every size, offset, enumerator and
 * prototype below against the real header wherever it is installed.
 *
 * What is declared: the objects the tracer reads (contexts, PDs, MRs, CQs, SRQs, QPs), what it
 * passes to the library or gets back (attributes, work requests, completions), the ops tables it
 * patches (ibv_context_ops, verbs_context, ibv_qp_ex) and the prototypes of the functions it
 * wraps.  Structures the tracer only passes on by pointer stay incomplete.  Slots of the tables
 * that the tracer never calls are declared with a generic function type (same size and place).
 *
 * The layouts are stable ABI: rdma-core only appends to ibv_qp_ex / ibv_cq_ex (behind comp_mask)
 * and prepends to verbs_context, whose `sz` says how much of it a library fills
 * (verbs_get_ctx_op below).  (About 600 lines: every structure the tracer allocates, indexes or
 * patches is declared whole, member by member, so that its size and each offset can be checked.)
 */
#ifndef ST_ABI_VERBS_H
#define ST_ABI_VERBS_H

/* the public header this file follows (build_info.json) */
#define ST_ABI_VERBS_FROM "rdma-core v44 infiniband/verbs.h"

#include <linux/types.h> /* __be16/__be32/__be64 (kernel UAPI, not rdma-core) */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

struct ibv_context;
struct ibv_comp_channel;
struct ibv_ah;
struct ibv_mw;
struct ibv_xrcd;
struct ibv_rwq_ind_table;

/* A table slot the tracer never calls: only its size and place matter. */
typedef void (*st_ibv_unused_fn)(void);

union ibv_gid {
	uint8_t raw[16];
	struct {
		__be64 subnet_prefix;
		__be64 interface_id;
	} global;
};

/* ---- device and port queries ---- */
struct ibv_device_attr {
	char fw_ver[64];
	__be64 node_guid;
	__be64 sys_image_guid;
	uint64_t max_mr_size;
	uint64_t page_size_cap;
	uint32_t vendor_id;
	uint32_t vendor_part_id;
	uint32_t hw_ver;
	int max_qp;
	int max_qp_wr;
	unsigned int device_cap_flags;
	int max_sge;
	int max_sge_rd;
	int max_cq;
	int max_cqe;
	int max_mr;
	int max_pd;
	int max_qp_rd_atom;
	int max_ee_rd_atom;
	int max_res_rd_atom;
	int max_qp_init_rd_atom;
	int max_ee_init_rd_atom;
	int atomic_cap; /* enum ibv_atomic_cap */
	int max_ee;
	int max_rdd;
	int max_mw;
	int max_raw_ipv6_qp;
	int max_raw_ethy_qp;
	int max_mcast_grp;
	int max_mcast_qp_attach;
	int max_total_mcast_qp_attach;
	int max_ah;
	int max_fmr;
	int max_map_per_fmr;
	int max_srq;
	int max_srq_wr;
	int max_srq_sge;
	uint16_t max_pkeys;
	uint8_t local_ca_ack_delay;
	uint8_t phys_port_cnt;
};

enum { IBV_LINK_LAYER_UNSPECIFIED, IBV_LINK_LAYER_INFINIBAND, IBV_LINK_LAYER_ETHERNET };

struct ibv_port_attr {
	int state;      /* enum ibv_port_state */
	int max_mtu;    /* enum ibv_mtu */
	int active_mtu; /* enum ibv_mtu */
	int gid_tbl_len;
	uint32_t port_cap_flags;
	uint32_t max_msg_sz;
	uint32_t bad_pkey_cntr;
	uint32_t qkey_viol_cntr;
	uint16_t pkey_tbl_len;
	uint16_t lid;
	uint16_t sm_lid;
	uint8_t lmc;
	uint8_t max_vl_num;
	uint8_t sm_sl;
	uint8_t subnet_timeout;
	uint8_t init_type_reply;
	uint8_t active_width;
	uint8_t active_speed;
	uint8_t phys_state;
	uint8_t link_layer;
	uint8_t flags;
	uint16_t port_cap_flags2;
};

/* ---- completions ---- */
enum ibv_wc_status { IBV_WC_SUCCESS = 0 };

struct ibv_wc {
	uint64_t wr_id;
	int status; /* enum ibv_wc_status */
	int opcode; /* enum ibv_wc_opcode */
	uint32_t vendor_err;
	uint32_t byte_len;
	union {
		__be32 imm_data;
		uint32_t invalidated_rkey;
	};
	uint32_t qp_num;
	uint32_t src_qp;
	unsigned int wc_flags;
	uint16_t pkey_index;
	uint16_t slid;
	uint8_t sl;
	uint8_t dlid_path_bits;
};

/* ---- PD, MR ---- */
struct ibv_mw_bind_info {
	struct ibv_mr *mr;
	uint64_t addr;
	uint64_t length;
	unsigned int mw_access_flags;
};

struct ibv_pd {
	struct ibv_context *context;
	uint32_t handle;
};

struct ibv_mr {
	struct ibv_context *context;
	struct ibv_pd *pd;
	void *addr;
	size_t length;
	uint32_t handle;
	uint32_t lkey;
	uint32_t rkey;
};

/* ---- addresses ---- */
struct ibv_global_route {
	union ibv_gid dgid;
	uint32_t flow_label;
	uint8_t sgid_index;
	uint8_t hop_limit;
	uint8_t traffic_class;
};

struct ibv_ah_attr {
	struct ibv_global_route grh;
	uint16_t dlid;
	uint8_t sl;
	uint8_t src_path_bits;
	uint8_t static_rate;
	uint8_t is_global;
	uint8_t port_num;
};

/* ---- SRQ ---- */
struct ibv_srq_attr {
	uint32_t max_wr;
	uint32_t max_sge;
	uint32_t srq_limit;
};

struct ibv_srq_init_attr {
	void *srq_context;
	struct ibv_srq_attr attr;
};

struct ibv_srq {
	struct ibv_context *context;
	void *srq_context;
	struct ibv_pd *pd;
	uint32_t handle;
	pthread_mutex_t mutex;
	pthread_cond_t cond;
	uint32_t events_completed;
};

/* ---- QP ---- */
enum ibv_qp_type { IBV_QPT_RC = 2, IBV_QPT_UC = 3, IBV_QPT_UD = 4 };

struct ibv_qp_cap {
	uint32_t max_send_wr;
	uint32_t max_recv_wr;
	uint32_t max_send_sge;
	uint32_t max_recv_sge;
	uint32_t max_inline_data;
};

struct ibv_qp_init_attr {
	void *qp_context;
	struct ibv_cq *send_cq;
	struct ibv_cq *recv_cq;
	struct ibv_srq *srq;
	struct ibv_qp_cap cap;
	int qp_type; /* enum ibv_qp_type */
	int sq_sig_all;
};

enum ibv_qp_init_attr_mask { IBV_QP_INIT_ATTR_SEND_OPS_FLAGS = 1 << 6 };

struct ibv_rx_hash_conf {
	uint8_t rx_hash_function;
	uint8_t rx_hash_key_len;
	uint8_t *rx_hash_key;
	uint64_t rx_hash_fields_mask;
};

struct ibv_qp_init_attr_ex {
	void *qp_context;
	struct ibv_cq *send_cq;
	struct ibv_cq *recv_cq;
	struct ibv_srq *srq;
	struct ibv_qp_cap cap;
	int qp_type; /* enum ibv_qp_type */
	int sq_sig_all;
	uint32_t comp_mask; /* enum ibv_qp_init_attr_mask */
	struct ibv_pd *pd;
	struct ibv_xrcd *xrcd;
	uint32_t create_flags;
	uint16_t max_tso_header;
	struct ibv_rwq_ind_table *rwq_ind_tbl;
	struct ibv_rx_hash_conf rx_hash_conf;
	uint32_t source_qpn;
	uint64_t send_ops_flags;
};

/* the bits of ibv_modify_qp's mask, in bit order (ibv.c names them by bit) */
enum ibv_qp_attr_mask {
	IBV_QP_STATE = 1 << 0,
	IBV_QP_CUR_STATE = 1 << 1,
	IBV_QP_EN_SQD_ASYNC_NOTIFY = 1 << 2,
	IBV_QP_ACCESS_FLAGS = 1 << 3,
	IBV_QP_PKEY_INDEX = 1 << 4,
	IBV_QP_PORT = 1 << 5,
	IBV_QP_QKEY = 1 << 6,
	IBV_QP_AV = 1 << 7,
	IBV_QP_PATH_MTU = 1 << 8,
	IBV_QP_TIMEOUT = 1 << 9,
	IBV_QP_RETRY_CNT = 1 << 10,
	IBV_QP_RNR_RETRY = 1 << 11,
	IBV_QP_RQ_PSN = 1 << 12,
	IBV_QP_MAX_QP_RD_ATOMIC = 1 << 13,
	IBV_QP_ALT_PATH = 1 << 14,
	IBV_QP_MIN_RNR_TIMER = 1 << 15,
	IBV_QP_SQ_PSN = 1 << 16,
	IBV_QP_MAX_DEST_RD_ATOMIC = 1 << 17,
	IBV_QP_PATH_MIG_STATE = 1 << 18,
	IBV_QP_CAP = 1 << 19,
	IBV_QP_DEST_QPN = 1 << 20,
};

struct ibv_qp_attr {
	int qp_state;       /* enum ibv_qp_state */
	int cur_qp_state;   /* enum ibv_qp_state */
	int path_mtu;       /* enum ibv_mtu */
	int path_mig_state; /* enum ibv_mig_state */
	uint32_t qkey;
	uint32_t rq_psn;
	uint32_t sq_psn;
	uint32_t dest_qp_num;
	unsigned int qp_access_flags;
	struct ibv_qp_cap cap;
	struct ibv_ah_attr ah_attr;
	struct ibv_ah_attr alt_ah_attr;
	uint16_t pkey_index;
	uint16_t alt_pkey_index;
	uint8_t en_sqd_async_notify;
	uint8_t sq_draining;
	uint8_t max_rd_atomic;
	uint8_t max_dest_rd_atomic;
	uint8_t min_rnr_timer;
	uint8_t port_num;
	uint8_t timeout;
	uint8_t retry_cnt;
	uint8_t rnr_retry;
	uint8_t alt_port_num;
	uint8_t alt_timeout;
	uint32_t rate_limit;
};

struct ibv_qp {
	struct ibv_context *context;
	void *qp_context;
	struct ibv_pd *pd;
	struct ibv_cq *send_cq;
	struct ibv_cq *recv_cq;
	struct ibv_srq *srq;
	uint32_t handle;
	uint32_t qp_num;
	int state;   /* enum ibv_qp_state */
	int qp_type; /* enum ibv_qp_type */
	pthread_mutex_t mutex;
	pthread_cond_t cond;
	uint32_t events_completed;
};

/* ---- work requests ---- */
enum ibv_wr_opcode {
	IBV_WR_RDMA_WRITE,
	IBV_WR_RDMA_WRITE_WITH_IMM,
	IBV_WR_SEND,
	IBV_WR_SEND_WITH_IMM,
	IBV_WR_RDMA_READ,
	IBV_WR_ATOMIC_CMP_AND_SWP,
	IBV_WR_ATOMIC_FETCH_AND_ADD,
	IBV_WR_LOCAL_INV,
	IBV_WR_BIND_MW,
	IBV_WR_SEND_WITH_INV,
	IBV_WR_TSO,
};

struct ibv_data_buf {
	void *addr;
	size_t length;
};

struct ibv_sge {
	uint64_t addr;
	uint32_t length;
	uint32_t lkey;
};

struct ibv_send_wr {
	uint64_t wr_id;
	struct ibv_send_wr *next;
	struct ibv_sge *sg_list;
	int num_sge;
	enum ibv_wr_opcode opcode;
	unsigned int send_flags;
	union {
		__be32 imm_data;
		uint32_t invalidate_rkey;
	};
	union {
		struct {
			uint64_t remote_addr;
			uint32_t rkey;
		} rdma;
		struct {
			uint64_t remote_addr;
			uint64_t compare_add;
			uint64_t swap;
			uint32_t rkey;
		} atomic;
		struct {
			struct ibv_ah *ah;
			uint32_t remote_qpn;
			uint32_t remote_qkey;
		} ud;
	} wr;
	union {
		struct {
			uint32_t remote_srqn;
		} xrc;
	} qp_type;
	union {
		struct {
			struct ibv_mw *mw;
			uint32_t rkey;
			struct ibv_mw_bind_info bind_info;
		} bind_mw;
		struct {
			void *hdr;
			uint16_t hdr_sz;
			uint16_t mss;
		} tso;
	};
};

struct ibv_recv_wr {
	uint64_t wr_id;
	struct ibv_recv_wr *next;
	struct ibv_sge *sg_list;
	int num_sge;
};

/* The extended post API: the provider's functions, one set per QP (ibv_qp_to_qp_ex). */
struct ibv_qp_ex {
	struct ibv_qp qp_base;
	uint64_t comp_mask;
	uint64_t wr_id;
	unsigned int wr_flags;
	void (*wr_atomic_cmp_swp)(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr, uint64_t compare,
				  uint64_t swap);
	void (*wr_atomic_fetch_add)(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr, uint64_t add);
	void (*wr_bind_mw)(struct ibv_qp_ex *qp, struct ibv_mw *mw, uint32_t rkey,
			   const struct ibv_mw_bind_info *bind_info);
	void (*wr_local_inv)(struct ibv_qp_ex *qp, uint32_t invalidate_rkey);
	void (*wr_rdma_read)(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr);
	void (*wr_rdma_write)(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr);
	void (*wr_rdma_write_imm)(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr, __be32 imm_data);
	void (*wr_send)(struct ibv_qp_ex *qp);
	void (*wr_send_imm)(struct ibv_qp_ex *qp, __be32 imm_data);
	void (*wr_send_inv)(struct ibv_qp_ex *qp, uint32_t invalidate_rkey);
	void (*wr_send_tso)(struct ibv_qp_ex *qp, void *hdr, uint16_t hdr_sz, uint16_t mss);
	void (*wr_set_ud_addr)(struct ibv_qp_ex *qp, struct ibv_ah *ah, uint32_t remote_qpn, uint32_t remote_qkey);
	void (*wr_set_xrc_srqn)(struct ibv_qp_ex *qp, uint32_t remote_srqn);
	void (*wr_set_inline_data)(struct ibv_qp_ex *qp, void *addr, size_t length);
	void (*wr_set_inline_data_list)(struct ibv_qp_ex *qp, size_t num_buf, const struct ibv_data_buf *buf_list);
	void (*wr_set_sge)(struct ibv_qp_ex *qp, uint32_t lkey, uint64_t addr, uint32_t length);
	void (*wr_set_sge_list)(struct ibv_qp_ex *qp, size_t num_sge, const struct ibv_sge *sg_list);
	void (*wr_start)(struct ibv_qp_ex *qp);
	int (*wr_complete)(struct ibv_qp_ex *qp);
	void (*wr_abort)(struct ibv_qp_ex *qp);
	void (*wr_atomic_write)(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr, const void *atomic_wr);
};

/* ---- CQ ---- */
struct ibv_cq {
	struct ibv_context *context;
	struct ibv_comp_channel *channel;
	void *cq_context;
	uint32_t handle;
	int cqe;
	pthread_mutex_t mutex;
	pthread_cond_t cond;
	uint32_t comp_events_completed;
	uint32_t async_events_completed;
};

/* The extended CQ (ibv_create_cq_ex) and its attributes are only passed on; an ibv_cq_ex starts with
 * an ibv_cq (ibv_cq_ex_to_cq is a cast). */
struct ibv_cq_ex;
struct ibv_cq_init_attr_ex;

/* ---- device, context and its ops ---- */
struct ibv_device {
	struct {
		st_ibv_unused_fn _dummy1;
		st_ibv_unused_fn _dummy2;
	} _ops;
	int node_type;      /* enum ibv_node_type */
	int transport_type; /* enum ibv_transport_type */
	char name[64];      /* the kernel device, e.g. mlx5_0 */
	char dev_name[64];
	char dev_path[256];
	char ibdev_path[256];
};

/* The calls verbs.h makes inline through context->ops (ibv_post_send, ...): the tracer keeps the
 * provider's and puts its wrappers in (providers/ibv/ibv_hot.c). */
struct ibv_context_ops {
	st_ibv_unused_fn _compat_query_device;
	st_ibv_unused_fn _compat_query_port;
	st_ibv_unused_fn _compat_alloc_pd;
	st_ibv_unused_fn _compat_dealloc_pd;
	st_ibv_unused_fn _compat_reg_mr;
	st_ibv_unused_fn _compat_rereg_mr;
	st_ibv_unused_fn _compat_dereg_mr;
	st_ibv_unused_fn alloc_mw;
	st_ibv_unused_fn bind_mw;
	st_ibv_unused_fn dealloc_mw;
	st_ibv_unused_fn _compat_create_cq;
	int (*poll_cq)(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);
	int (*req_notify_cq)(struct ibv_cq *cq, int solicited_only);
	st_ibv_unused_fn _compat_cq_event;
	st_ibv_unused_fn _compat_resize_cq;
	st_ibv_unused_fn _compat_destroy_cq;
	st_ibv_unused_fn _compat_create_srq;
	st_ibv_unused_fn _compat_modify_srq;
	st_ibv_unused_fn _compat_query_srq;
	st_ibv_unused_fn _compat_destroy_srq;
	int (*post_srq_recv)(struct ibv_srq *srq, struct ibv_recv_wr *recv_wr, struct ibv_recv_wr **bad_recv_wr);
	st_ibv_unused_fn _compat_create_qp;
	st_ibv_unused_fn _compat_query_qp;
	st_ibv_unused_fn _compat_modify_qp;
	st_ibv_unused_fn _compat_destroy_qp;
	int (*post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
	int (*post_recv)(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
	st_ibv_unused_fn _compat_create_ah;
	st_ibv_unused_fn _compat_destroy_ah;
	st_ibv_unused_fn _compat_attach_mcast;
	st_ibv_unused_fn _compat_detach_mcast;
	st_ibv_unused_fn _compat_async_event;
};

struct ibv_context {
	struct ibv_device *device;
	struct ibv_context_ops ops;
	int cmd_fd;
	int async_fd;
	int num_comp_vectors;
	pthread_mutex_t mutex;
	void *abi_compat; /* __VERBS_ABI_IS_EXTENDED: the context is the tail of a verbs_context */
};

/* The extended context: newer ops in front of the ibv_context, the newest first; `sz` is the size
 * the library filled, counted back from the context (so an older library has fewer of them). */
struct verbs_context {
	int (*query_port)(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *port_attr,
			  size_t port_attr_len);
	st_ibv_unused_fn advise_mr;
	st_ibv_unused_fn alloc_null_mr;
	st_ibv_unused_fn read_counters;
	st_ibv_unused_fn attach_counters_point_flow;
	st_ibv_unused_fn create_counters;
	st_ibv_unused_fn destroy_counters;
	st_ibv_unused_fn reg_dm_mr;
	st_ibv_unused_fn alloc_dm;
	st_ibv_unused_fn free_dm;
	st_ibv_unused_fn modify_flow_action_esp;
	st_ibv_unused_fn destroy_flow_action;
	st_ibv_unused_fn create_flow_action_esp;
	st_ibv_unused_fn modify_qp_rate_limit;
	st_ibv_unused_fn alloc_parent_domain;
	st_ibv_unused_fn dealloc_td;
	st_ibv_unused_fn alloc_td;
	st_ibv_unused_fn modify_cq;
	st_ibv_unused_fn post_srq_ops;
	st_ibv_unused_fn destroy_rwq_ind_table;
	st_ibv_unused_fn create_rwq_ind_table;
	st_ibv_unused_fn destroy_wq;
	st_ibv_unused_fn modify_wq;
	st_ibv_unused_fn create_wq;
	st_ibv_unused_fn query_rt_values;
	struct ibv_cq_ex *(*create_cq_ex)(struct ibv_context *context, struct ibv_cq_init_attr_ex *init_attr);
	void *priv;
	st_ibv_unused_fn query_device_ex;
	st_ibv_unused_fn ibv_destroy_flow;
	st_ibv_unused_fn ABI_placeholder2;
	st_ibv_unused_fn ibv_create_flow;
	st_ibv_unused_fn ABI_placeholder1;
	st_ibv_unused_fn open_qp;
	struct ibv_qp *(*create_qp_ex)(struct ibv_context *context, struct ibv_qp_init_attr_ex *qp_init_attr_ex);
	st_ibv_unused_fn get_srq_num;
	st_ibv_unused_fn create_srq_ex;
	st_ibv_unused_fn open_xrcd;
	st_ibv_unused_fn close_xrcd;
	uint64_t _ABI_placeholder3;
	size_t sz;
	struct ibv_context context;
};

#define __VERBS_ABI_IS_EXTENDED ((void *)UINTPTR_MAX)

/* The verbs_context of ctx when the library made one, else NULL. */
static inline struct verbs_context *st_verbs_ctx(struct ibv_context *ctx)
{
	if (ctx->abi_compat != __VERBS_ABI_IS_EXTENDED)
		return NULL;
	return (struct verbs_context *)((char *)ctx - offsetof(struct verbs_context, context));
}

/* The verbs_context of ctx if its library filled the slot `op` and set it, else NULL: the slot is
 * filled when it lies within the last `sz` bytes before the context. */
#define verbs_get_ctx_op(ctx, op)                                                                  \
	__extension__({                                                                            \
		struct verbs_context *v_ = st_verbs_ctx(ctx);                                      \
		(v_ && v_->sz >= offsetof(struct verbs_context, context) + sizeof(v_->context) -   \
					 offsetof(struct verbs_context, op) &&                     \
		 v_->op)                                                                           \
			? v_                                                                       \
			: NULL;                                                                    \
	})

/* ---- the exported functions the ibv provider wraps (providers/ibv/ibv_shims.def) ---- */
struct ibv_device **ibv_get_device_list(int *num_devices);
struct ibv_context *ibv_open_device(struct ibv_device *device);
int ibv_close_device(struct ibv_context *context);
struct ibv_pd *ibv_alloc_pd(struct ibv_context *context);
int ibv_dealloc_pd(struct ibv_pd *pd);
struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access);
struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access);
struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned int access);
struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
				 int access);
int ibv_dereg_mr(struct ibv_mr *mr);
struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
			     struct ibv_comp_channel *channel, int comp_vector);
int ibv_destroy_cq(struct ibv_cq *cq);
struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *srq_init_attr);
int ibv_destroy_srq(struct ibv_srq *srq);
int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context);
struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr);
int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask);
int ibv_destroy_qp(struct ibv_qp *qp);
struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp);

#endif /* ST_ABI_VERBS_H */
