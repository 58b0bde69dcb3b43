/*
 * Event types of trace format v1 — the C definition.
 *
 * type = (layer << 8) | operation.  The meaning of each record field is
 * given next to the type and, with the same names, in
 * sigmatrace/format/events.py; the conformance test compares the two lists.
 * "EXT" lists the fields of the optional continuation record (x0,x1,x2,x3 =
 * tsc,aux,obj,arg slots).  Modes: A = aggregate counter, S = simple, F = full.
 *
 * Adding a type: append it here AND in events.py, never renumber.
 */
#ifndef SIGMATRACE_EVENTS_H
#define SIGMATRACE_EVENTS_H

enum st_layer {
	ST_LAYER_TRACE = 0x00,
	ST_LAYER_IBV   = 0x01,
	ST_LAYER_MLX5  = 0x02,
	ST_LAYER_CUDA  = 0x03,
	ST_LAYER_DB    = 0x04, /* doorbells and WQEs seen through the UAR */
	ST_LAYER_UCX   = 0x05,
	ST_LAYER_OFI   = 0x06,
	ST_LAYER_NCCL  = 0x07,
};

/* X(name, value) */
#define ST_EVENT_LIST(X)                                                         \
	/* --- trace (internal) --- */                                           \
	X(EXT,                      0x0001) /* continuation of previous record */  \
	X(DROPS,                    0x0002) /* arg=dropped events since last DROPS */ \
	X(THREAD_START,             0x0003) /* obj=tid */                          \
	X(THREAD_END,               0x0004) /* obj=tid */                          \
	X(MARK,                     0x0005) /* obj=user id, arg=side STRING */     \
	X(FORK,                     0x0006) /* obj=child pid (in parent) */        \
	/* --- libibverbs --- */                                                 \
	X(IBV_OPEN_DEVICE,          0x0101) /* obj=ctx id, arg=side JSON */        \
	X(IBV_CLOSE_DEVICE,         0x0102) /* obj=ctx id */                       \
	X(IBV_ALLOC_PD,             0x0103) /* obj=pd id, arg=ctx id */            \
	X(IBV_DEALLOC_PD,           0x0104) /* obj=pd id */                        \
	X(IBV_REG_MR,               0x0105) /* obj=lkey, arg=addr; EXT x0=length x1=access x2=rkey x3=pd id */ \
	X(IBV_DEREG_MR,             0x0106) /* obj=lkey */                         \
	X(IBV_CREATE_CQ,            0x0107) /* obj=cq id, arg=cqe */               \
	X(IBV_DESTROY_CQ,           0x0108) /* obj=cq id */                        \
	X(IBV_CREATE_QP,            0x0109) /* obj=qpn, aux=qp_type, arg=side JSON */ \
	X(IBV_MODIFY_QP,            0x010a) /* obj=qpn, aux=new state, arg=side JSON; EXT x0=attr_mask x1=dlid x2=dest_qp_num */ \
	X(IBV_DESTROY_QP,           0x010b) /* obj=qpn */                          \
	X(IBV_POST_SEND,            0x0110) /* S: obj=qpn, aux=num_wr, arg=bytes; EXT x0=first wr_id x1=first opcode x2=ret */ \
	X(IBV_SEND_WR,              0x0111) /* F: obj=qpn, aux=opcode|flags<<8, arg=wr_id; EXT x0=raddr x1=num_sge x2=rkey x3=bytes (UD: x0=remote qpn, x2=ah id) */ \
	X(IBV_POST_RECV,            0x0112) /* S: obj=qpn, aux=num_wr, arg=bytes; EXT x0=first wr_id x2=ret */ \
	X(IBV_RECV_WR,              0x0113) /* F: obj=qpn, aux=num_sge, arg=wr_id; EXT x0=addr x2=lkey x3=bytes */ \
	X(IBV_POST_SRQ_RECV,        0x0114) /* S: obj=srq id, aux=num_wr, arg=bytes */ \
	X(IBV_POLL_CQ,              0x0115) /* F: obj=cq id, aux=returned, arg=requested|polls<<32 */ \
	X(IBV_WC,                   0x0116) /* F: obj=qpn, aux=status|opcode<<8, arg=wr_id; EXT x0=imm x1=wc_flags x2=byte_len x3=vendor_err */ \
	X(IBV_WR_COMPLETE,          0x0118) /* S: obj=qpn, aux=num_wr, arg=bytes (ibv_wr_* API) */ \
	X(IBV_REQ_NOTIFY_CQ,        0x0119) /* F: obj=cq id, aux=solicited_only */ \
	X(IBV_GET_CQ_EVENT,         0x011a) /* F: obj=cq id */                     \
	X(IBV_CREATE_SRQ,           0x011b) /* obj=srq id, arg=max_wr */           \
	X(IBV_CREATE_AH,            0x011c) /* obj=ah id, aux=port, arg=side JSON (dlid, is_global, dgid, sl, pd) */ \
	X(IBV_DESTROY_AH,           0x011d) /* obj=ah id */                        \
	/* --- mlx5dv / DevX --- */                                              \
	X(MLX5_DEVX_ALLOC_UAR,      0x0201) /* obj=page_id, aux=flags, arg=reg_addr; EXT x0=base_addr x2=flags x3=mmap_off */ \
	X(MLX5_DEVX_FREE_UAR,       0x0202) /* obj=page_id, arg=reg_addr */        \
	X(MLX5_DEVX_UMEM_REG,       0x0203) /* obj=umem_id, aux=ST_UMEM_F_*, arg=addr; EXT x0=size x2=access */ \
	X(MLX5_DEVX_UMEM_DEREG,     0x0204) /* obj=umem_id */                      \
	X(MLX5_DEVX_OBJ_CREATE,     0x0205) /* obj=qpn/cqn, aux=PRM opcode, arg=side PRM_COMMAND; EXT x0=handle x2=status */ \
	X(MLX5_DEVX_OBJ_MODIFY,     0x0206) /* obj=qpn, aux=PRM opcode, arg=side PRM_COMMAND */ \
	X(MLX5_DEVX_OBJ_DESTROY,    0x0207) /* obj=qpn/cqn, aux=create opcode, arg=handle */ \
	X(MLX5_DEVX_GENERAL_CMD,    0x0208) /* aux=PRM opcode, arg=side PRM_COMMAND */ \
	X(MLX5_DEVX_QUERY_EQN,      0x0209) /* obj=eqn, arg=vector */              \
	X(MLX5_DV_INIT_QP,          0x020a) /* obj=qpn, arg=side JSON (sq buf, wqe_cnt, bf reg, dbrec) */ \
	X(MLX5_DEVX_OBJ_QUERY,      0x020b) /* obj=number, aux=PRM opcode, arg=side PRM_COMMAND */ \
	/* --- CUDA driver --- */                                                \
	X(CU_MEM_HOST_REGISTER,     0x0301) /* obj=flags, aux=result, arg=host ptr; EXT x0=size */ \
	X(CU_MEM_HOST_GET_DEVPTR,   0x0302) /* obj=result, aux=hijacked, arg=host ptr; EXT x0=ptr given x3=real ptr */ \
	X(CU_MEM_HOST_UNREGISTER,   0x0303) /* aux=result, arg=host ptr */         \
	X(CU_GET_PROC_ADDRESS,      0x0304) /* obj=cuda version, aux=wrapped, arg=side STRING; EXT x0=flags */ \
	X(CU_GET_EXPORT_TABLE,      0x0305) /* aux=result, arg=side BLOB (uuid) */  \
	X(CU_POINTER_GET_ATTRIBUTE, 0x0306) /* obj=attribute, aux=result, arg=ptr; EXT x0=value */ \
	/* --- doorbells (UAR interposition) --- */                              \
	X(DB_DOORBELL,              0x0401) /* obj=qpn, aux=producer index, arg=raw 8 bytes (LE load) */ \
	X(DB_HIJACK_INSTALL,        0x0402) /* obj=uar page_id, aux=gpu ordinal, arg=side JSON */ \
	X(DB_HIJACK_REMOVE,         0x0403) /* obj=uar page_id, arg=doorbells seen */ \
	X(DB_WQE,                   0x0404) /* obj=qpn, aux=first wqe index, arg=side WQE_BYTES */ \
	X(DB_WQE_LOST,              0x0405) /* obj=qpn, aux=first wqe index, arg=WQEBBs lost; EXT x2=reason */ \
	X(DB_FORWARD,               0x0406) /* F: obj=qpn, aux=producer index, arg=tsc of observation */ \
	X(DB_DBR,                   0x0407) /* F: obj=qpn, aux=DBR producer index */ \
	/* --- UCX (UCP) --- */                                                  \
	X(UCP_WORKER_CREATE,        0x0501) /* obj=worker id, arg=side JSON */     \
	X(UCP_EP_CREATE,            0x0502) /* obj=ep id, arg=side JSON (peer) */  \
	X(UCP_EP_CLOSE,             0x0503) /* obj=ep id */                        \
	X(UCP_PUT,                  0x0504) /* obj=ep id, aux=variant, arg=bytes; EXT x0=raddr x3=request */ \
	X(UCP_GET,                  0x0505) /* obj=ep id, aux=variant, arg=bytes; EXT x0=raddr x3=request */ \
	X(UCP_ATOMIC,               0x0506) /* obj=ep id, aux=op, arg=bytes; EXT x0=raddr x3=request */ \
	X(UCP_TAG_SEND,             0x0507) /* obj=ep id, aux=variant, arg=bytes; EXT x0=tag x3=request */ \
	X(UCP_TAG_RECV,             0x0508) /* obj=worker id, aux=variant, arg=bytes; EXT x0=tag x3=request */ \
	X(UCP_STREAM_SEND,          0x0509) /* obj=ep id, aux=variant, arg=bytes; EXT x3=request */ \
	X(UCP_STREAM_RECV,          0x050a) /* obj=ep id, aux=variant, arg=bytes; EXT x3=request */ \
	X(UCP_AM_SEND,              0x050b) /* obj=ep id, aux=am id, arg=bytes; EXT x0=header bytes x3=request */ \
	X(UCP_AM_RECV,              0x050c) /* obj=worker id, aux=am id, arg=bytes */ \
	X(UCP_WORKER_PROGRESS,      0x050d) /* F: obj=worker id, aux=returned, arg=polls<<32 */  \
	X(UCP_REQUEST_DONE,         0x050e) /* obj=ep/worker id, aux=status, arg=request */ \
	X(UCP_FLUSH,                0x050f) /* obj=ep/worker id */                 \
	/* --- libfabric --- */                                                  \
	X(OFI_FABRIC,               0x0601) /* obj=fabric id, arg=side JSON */     \
	X(OFI_DOMAIN,               0x0602) /* obj=domain id, arg=side JSON */     \
	X(OFI_ENDPOINT,             0x0603) /* obj=ep id, arg=side JSON */         \
	X(OFI_AV_INSERT,            0x0604) /* obj=av id, aux=inserted, arg=side JSON */ \
	X(OFI_CQ_OPEN,              0x0605) /* obj=cq id, arg=side JSON */         \
	X(OFI_SEND,                 0x0606) /* obj=ep id, aux=variant, arg=bytes; EXT x0=dest x3=context */ \
	X(OFI_RECV,                 0x0607) /* obj=ep id, aux=variant, arg=bytes; EXT x0=src x3=context */ \
	X(OFI_TSEND,                0x0608) /* obj=ep id, aux=variant, arg=bytes; EXT x0=dest x2=ret x3=tag */ \
	X(OFI_TRECV,                0x0609) /* obj=ep id, aux=variant, arg=bytes; EXT x0=src x2=ret x3=tag */ \
	X(OFI_WRITE,                0x060a) /* obj=ep id, aux=variant, arg=bytes; EXT x0=dest x2=ret x3=raddr */ \
	X(OFI_READ,                 0x060b) /* obj=ep id, aux=variant, arg=bytes; EXT x0=dest x2=ret x3=raddr */ \
	X(OFI_ATOMIC,               0x060c) /* obj=ep id, aux=op, arg=bytes; EXT x0=dest x2=ret x3=raddr */ \
	X(OFI_CQ_READ,              0x060d) /* F: obj=cq id, aux=returned, arg=requested|polls<<32 */ \
	X(OFI_COMPLETION,           0x060e) /* F: obj=cq id, aux=flags low 16, arg=op_context; EXT x0=len x3=flags */ \
	X(OFI_MR_REG,               0x060f) /* obj=mr id, arg=addr; EXT x0=len x3=key */ \
	/* --- NCCL (docs/tracer.md "nccl"; ABI of NCCL 2.28) --- */            \
	X(NCCL_COMM_INIT,           0x0701) /* obj=comm id, aux=ST_NCCL_INIT_*, arg=side JSON; EXT x0=duration ticks x1=result x2=rank x3=nranks */ \
	X(NCCL_COMM_DESTROY,        0x0702) /* obj=comm id, aux=ST_NCCL_END_*, arg=result */ \
	X(NCCL_COLL,                0x0703) /* obj=comm id, aux=ST_NCCL_COLL_*|datatype<<8, arg=count; EXT x0=stream x1=result|redop<<8 x2=root/peer x3=duration ticks */ \
	X(NCCL_GROUP_START,         0x0704) /* aux=group depth after the call, arg=result */ \
	X(NCCL_GROUP_END,           0x0705) /* aux=group depth before the call, arg=result; EXT x0=duration ticks x1=simulated */

enum st_event_type {
#define ST_X_ENUM(name, value) ST_EV_##name = value,
	ST_EVENT_LIST(ST_X_ENUM)
#undef ST_X_ENUM
};

/* Idle polls (UCP_WORKER_PROGRESS, OFI_CQ_READ, IBV_POLL_CQ with aux 0: the call found nothing).  A run
 * of them on one thread, of one key (type, object, requested count: arg bits 0..31), with nothing but
 * idle polls (of any key) recorded by the thread between, is recorded as its first call and its last
 * call; the last one's arg bits 32..63 ("polls") are the calls it stands for (itself and the unrecorded
 * ones since the first).  0 there: the record is one call.  A
 * progress loop makes millions of empty polls between two operations; recorded one by one they filled
 * the rings and pushed out the operations themselves (docs/tracer.md, "Idle polls"). */
#define ST_IDLE_POLLS_SHIFT 32
#define ST_IDLE_POLLS_MAX   0xffffffffu

/* aux flags of MLX5_DEVX_UMEM_REG */
#define ST_UMEM_F_GPU    0x1u
#define ST_UMEM_F_DMABUF 0x2u

/* EXT x2 of DB_WQE_LOST */
enum st_wqe_lost_reason {
	ST_WQE_LOST_OVERWRITTEN = 1,
	ST_WQE_LOST_CORRUPT     = 2,
	ST_WQE_LOST_COPY_FAILED = 3,
	ST_WQE_LOST_RING_FULL   = 4,
	ST_WQE_LOST_TRACE_DROPPED = 5, /* recovered, but the trace had no room for its bytes (side record dropped) */
};

/* aux of NCCL_COMM_INIT: the call that created the communicator */
enum st_nccl_init {
	ST_NCCL_INIT_RANK          = 0, /* ncclCommInitRank */
	ST_NCCL_INIT_RANK_CONFIG   = 1, /* ncclCommInitRankConfig */
	ST_NCCL_INIT_ALL           = 2, /* ncclCommInitAll (one event per communicator) */
	ST_NCCL_INIT_RANK_SCALABLE = 3, /* ncclCommInitRankScalable */
	ST_NCCL_INIT_SPLIT         = 4, /* ncclCommSplit */
};

/* aux of NCCL_COMM_DESTROY */
enum st_nccl_end {
	ST_NCCL_END_DESTROY  = 0, /* ncclCommDestroy */
	ST_NCCL_END_ABORT    = 1, /* ncclCommAbort */
	ST_NCCL_END_FINALIZE = 2, /* ncclCommFinalize */
};

/* aux bits 0..7 of NCCL_COLL: the call */
enum st_nccl_coll {
	ST_NCCL_COLL_ALL_REDUCE     = 0,
	ST_NCCL_COLL_BROADCAST      = 1,
	ST_NCCL_COLL_BCAST          = 2, /* ncclBcast (in place) */
	ST_NCCL_COLL_REDUCE         = 3,
	ST_NCCL_COLL_ALL_GATHER     = 4,
	ST_NCCL_COLL_REDUCE_SCATTER = 5,
	ST_NCCL_COLL_ALL_TO_ALL     = 6,
	ST_NCCL_COLL_GATHER         = 7,
	ST_NCCL_COLL_SCATTER        = 8,
	ST_NCCL_COLL_SEND           = 9,
	ST_NCCL_COLL_RECV           = 10,
};
/* redop byte of NCCL_COLL EXT x1: ncclRedOp_t (0 sum .. 4 avg, 5.. dynamic), saturated at 0xfe; 0xff: none */
#define ST_NCCL_REDOP_NONE 0xffu
/* root/peer (EXT x2) of a call without one */
#define ST_NCCL_NO_PEER 0xffffffffu

#endif /* SIGMATRACE_EVENTS_H */
