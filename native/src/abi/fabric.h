/*
 * The libfabric ABI pieces the tracer uses, declared here so that it builds without libfabric's
 * development headers (issue 17, F27).  Layouts and values are those of libfabric 1.17's public
 * headers <rdma/fabric.h>, <rdma/fi_domain.h>, <rdma/fi_endpoint.h>, <rdma/fi_cm.h>,
 * <rdma/fi_eq.h>, <rdma/fi_rma.h>, <rdma/fi_tagged.h>, <rdma/fi_atomic.h> and <rdma/fi_errno.h>
 * (Debian 12's libfabric-dev 1.17.0); nothing here is libfabric's code.
 * tests/test_abi_conformance.py checks them against the real headers wherever they are installed.
 *
 * Declared: the fid objects and the ops tables the tracer copies and patches (every slot in its
 * place; the slots it never wraps with a generic function type), the fi_info it reads, the
 * message descriptors and CQ entry formats, and fi_fabric (the one exported function it wraps).
 * Every table starts with its `size`: a provider built against an older libfabric may hand out a
 * shorter one (providers/ofi/ofi.c copies only that much).
 */
#ifndef ST_ABI_FABRIC_H
#define ST_ABI_FABRIC_H

/* the public header this file follows (build_info.json) */
#define ST_ABI_FABRIC_FROM "libfabric 1.17 rdma/fabric.h, rdma/fi_*.h"

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h> /* ssize_t */
#include <sys/uio.h>   /* struct iovec */

typedef uint64_t fi_addr_t;
#define FI_ADDR_UNSPEC ((uint64_t)-1)
#define FI_ENOSYS ENOSYS

/* A table slot the tracer never calls: only its size and place matter. */
typedef void (*st_fi_unused_fn)(void);

struct fid;
typedef struct fid *fid_t;
struct fid_fabric;
struct fid_domain;
struct fid_ep;
struct fid_cq;
struct fid_av;
struct fid_mr;
struct fid_nic;
struct fi_av_attr;
struct fi_tx_attr;
struct fi_rx_attr;

/* ---- fid: every object starts with one ---- */
enum { FI_ENABLE = 6 }; /* fi_control command (fi_enable) */

struct fi_ops {
	size_t size;
	int (*close)(struct fid *fid);
	st_fi_unused_fn bind;
	int (*control)(struct fid *fid, int command, void *arg);
	st_fi_unused_fn ops_open;
	st_fi_unused_fn tostr;
	st_fi_unused_fn ops_set;
};

struct fid {
	size_t fclass;
	void *context;
	struct fi_ops *ops;
};

/* ---- fi_info and its attributes ---- */
enum fi_ep_type { FI_EP_UNSPEC, FI_EP_MSG, FI_EP_DGRAM, FI_EP_RDM };

struct fi_ep_attr {
	enum fi_ep_type type;
	uint32_t protocol;
	uint32_t protocol_version;
	size_t max_msg_size;
	size_t msg_prefix_size;
	size_t max_order_raw_size;
	size_t max_order_war_size;
	size_t max_order_waw_size;
	uint64_t mem_tag_format;
	size_t tx_ctx_cnt;
	size_t rx_ctx_cnt;
	size_t auth_key_size;
	uint8_t *auth_key;
};

struct fi_domain_attr {
	struct fid_domain *domain;
	char *name;
	int threading;        /* enum fi_threading */
	int control_progress; /* enum fi_progress */
	int data_progress;    /* enum fi_progress */
	int resource_mgmt;    /* enum fi_resource_mgmt */
	int av_type;          /* enum fi_av_type */
	int mr_mode;
	size_t mr_key_size;
	size_t cq_data_size;
	size_t cq_cnt;
	size_t ep_cnt;
	size_t tx_ctx_cnt;
	size_t rx_ctx_cnt;
	size_t max_ep_tx_ctx;
	size_t max_ep_rx_ctx;
	size_t max_ep_stx_ctx;
	size_t max_ep_srx_ctx;
	size_t cntr_cnt;
	size_t mr_iov_limit;
	uint64_t caps;
	uint64_t mode;
	uint8_t *auth_key;
	size_t auth_key_size;
	size_t max_err_data;
	size_t mr_cnt;
	uint32_t tclass;
};

struct fi_fabric_attr {
	struct fid_fabric *fabric;
	char *name;
	char *prov_name;
	uint32_t prov_version;
	uint32_t api_version;
};

struct fi_info {
	struct fi_info *next;
	uint64_t caps;
	uint64_t mode;
	uint32_t addr_format;
	size_t src_addrlen;
	size_t dest_addrlen;
	void *src_addr;
	void *dest_addr;
	fid_t handle;
	struct fi_tx_attr *tx_attr;
	struct fi_rx_attr *rx_attr;
	struct fi_ep_attr *ep_attr;
	struct fi_domain_attr *domain_attr;
	struct fi_fabric_attr *fabric_attr;
	struct fid_nic *nic;
};

/* ---- fabric ---- */
struct fi_ops_fabric {
	size_t size;
	int (*domain)(struct fid_fabric *fabric, struct fi_info *info, struct fid_domain **dom, void *context);
	st_fi_unused_fn passive_ep;
	st_fi_unused_fn eq_open;
	st_fi_unused_fn wait_open;
	st_fi_unused_fn trywait;
	int (*domain2)(struct fid_fabric *fabric, struct fi_info *info, struct fid_domain **dom, uint64_t flags,
		       void *context);
};

struct fid_fabric {
	struct fid fid;
	struct fi_ops_fabric *ops;
	uint32_t api_version;
};

/* ---- domain, memory registration, address vectors ---- */
enum fi_datatype {
	FI_INT8,
	FI_UINT8,
	FI_INT16,
	FI_UINT16,
	FI_INT32,
	FI_UINT32,
	FI_INT64,
	FI_UINT64,
	FI_FLOAT,
	FI_DOUBLE,
	FI_FLOAT_COMPLEX,
	FI_DOUBLE_COMPLEX,
	FI_LONG_DOUBLE,
	FI_LONG_DOUBLE_COMPLEX,
	FI_DATATYPE_LAST,
	FI_INT128 = FI_DATATYPE_LAST,
	FI_UINT128,
	FI_VOID = 256, /* FI_COLLECTIVE_OFFSET: the enum is an int */
};

enum fi_op { FI_MIN, FI_ATOMIC_OP_LAST = 19, FI_NOOP = 256 };

struct fi_cq_attr;

struct fi_ops_domain {
	size_t size;
	int (*av_open)(struct fid_domain *domain, struct fi_av_attr *attr, struct fid_av **av, void *context);
	int (*cq_open)(struct fid_domain *domain, struct fi_cq_attr *attr, struct fid_cq **cq, void *context);
	int (*endpoint)(struct fid_domain *domain, struct fi_info *info, struct fid_ep **ep, void *context);
	st_fi_unused_fn scalable_ep;
	st_fi_unused_fn cntr_open;
	st_fi_unused_fn poll_open;
	st_fi_unused_fn stx_ctx;
	st_fi_unused_fn srx_ctx;
	st_fi_unused_fn query_atomic;
	st_fi_unused_fn query_collective;
	st_fi_unused_fn endpoint2;
};

struct fi_mr_attr {
	const struct iovec *mr_iov;
	size_t iov_count;
	uint64_t access;
	uint64_t offset;
	uint64_t requested_key;
	void *context;
	size_t auth_key_size;
	uint8_t *auth_key;
	int iface; /* enum fi_hmem_iface */
	union {
		uint64_t reserved;
		int cuda;
		int ze;
		int neuron;
		int synapseai;
	} device;
};

struct fi_ops_mr {
	size_t size;
	int (*reg)(struct fid *fid, const void *buf, size_t len, uint64_t access, uint64_t offset, uint64_t requested_key,
		   uint64_t flags, struct fid_mr **mr, void *context);
	int (*regv)(struct fid *fid, const struct iovec *iov, size_t count, uint64_t access, uint64_t offset,
		    uint64_t requested_key, uint64_t flags, struct fid_mr **mr, void *context);
	int (*regattr)(struct fid *fid, const struct fi_mr_attr *attr, uint64_t flags, struct fid_mr **mr);
};

struct fid_domain {
	struct fid fid;
	struct fi_ops_domain *ops;
	struct fi_ops_mr *mr;
};

struct fid_mr {
	struct fid fid;
	void *mem_desc;
	uint64_t key;
};

struct fi_ops_av {
	size_t size;
	int (*insert)(struct fid_av *av, const void *addr, size_t count, fi_addr_t *fi_addr, uint64_t flags,
		      void *context);
	st_fi_unused_fn insertsvc;
	st_fi_unused_fn insertsym;
	st_fi_unused_fn remove;
	st_fi_unused_fn lookup;
	st_fi_unused_fn straddr;
	st_fi_unused_fn av_set;
};

struct fid_av {
	struct fid fid;
	struct fi_ops_av *ops;
};

/* ---- completion queues ---- */
enum fi_cq_format {
	FI_CQ_FORMAT_UNSPEC,
	FI_CQ_FORMAT_CONTEXT,
	FI_CQ_FORMAT_MSG,
	FI_CQ_FORMAT_DATA,
	FI_CQ_FORMAT_TAGGED,
};

struct fi_cq_attr {
	size_t size;
	uint64_t flags;
	enum fi_cq_format format;
	int wait_obj; /* enum fi_wait_obj */
	int signaling_vector;
	int wait_cond; /* enum fi_cq_wait_cond */
	struct fid_wait *wait_set;
};

struct fi_cq_entry {
	void *op_context;
};

struct fi_cq_msg_entry {
	void *op_context;
	uint64_t flags;
	size_t len;
};

struct fi_cq_data_entry {
	void *op_context;
	uint64_t flags;
	size_t len;
	void *buf;
	uint64_t data;
};

struct fi_cq_tagged_entry {
	void *op_context;
	uint64_t flags;
	size_t len;
	void *buf;
	uint64_t data;
	uint64_t tag;
};

struct fi_ops_cq {
	size_t size;
	ssize_t (*read)(struct fid_cq *cq, void *buf, size_t count);
	ssize_t (*readfrom)(struct fid_cq *cq, void *buf, size_t count, fi_addr_t *src_addr);
	st_fi_unused_fn readerr;
	ssize_t (*sread)(struct fid_cq *cq, void *buf, size_t count, const void *cond, int timeout);
	ssize_t (*sreadfrom)(struct fid_cq *cq, void *buf, size_t count, fi_addr_t *src_addr, const void *cond,
			     int timeout);
	st_fi_unused_fn signal;
	st_fi_unused_fn strerror;
};

struct fid_cq {
	struct fid fid;
	struct fi_ops_cq *ops;
};

/* ---- endpoints: one table per kind of operation ---- */
struct fi_msg {
	const struct iovec *msg_iov;
	void **desc;
	size_t iov_count;
	fi_addr_t addr;
	void *context;
	uint64_t data;
};

struct fi_msg_tagged {
	const struct iovec *msg_iov;
	void **desc;
	size_t iov_count;
	fi_addr_t addr;
	uint64_t tag;
	uint64_t ignore;
	void *context;
	uint64_t data;
};

struct fi_rma_iov {
	uint64_t addr;
	size_t len;
	uint64_t key;
};

struct fi_rma_ioc {
	uint64_t addr;
	size_t count;
	uint64_t key;
};

struct fi_msg_rma {
	const struct iovec *msg_iov;
	void **desc;
	size_t iov_count;
	fi_addr_t addr;
	const struct fi_rma_iov *rma_iov;
	size_t rma_iov_count;
	void *context;
	uint64_t data;
};

struct fi_ioc {
	void *addr;
	size_t count;
};

struct fi_msg_atomic {
	const struct fi_ioc *msg_iov;
	void **desc;
	size_t iov_count;
	fi_addr_t addr;
	const struct fi_rma_ioc *rma_iov;
	size_t rma_iov_count;
	enum fi_datatype datatype;
	enum fi_op op;
	void *context;
	uint64_t data;
};

struct fi_ops_cm {
	size_t size;
	st_fi_unused_fn setname;
	int (*getname)(fid_t fid, void *addr, size_t *addrlen);
	st_fi_unused_fn getpeer;
	st_fi_unused_fn connect;
	st_fi_unused_fn listen;
	st_fi_unused_fn accept;
	st_fi_unused_fn reject;
	st_fi_unused_fn shutdown;
	st_fi_unused_fn join;
};

struct fi_ops_msg {
	size_t size;
	ssize_t (*recv)(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src_addr, void *context);
	ssize_t (*recvv)(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count, fi_addr_t src_addr,
			 void *context);
	ssize_t (*recvmsg)(struct fid_ep *ep, const struct fi_msg *msg, uint64_t flags);
	ssize_t (*send)(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest_addr, void *context);
	ssize_t (*sendv)(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count, fi_addr_t dest_addr,
			 void *context);
	ssize_t (*sendmsg)(struct fid_ep *ep, const struct fi_msg *msg, uint64_t flags);
	ssize_t (*inject)(struct fid_ep *ep, const void *buf, size_t len, fi_addr_t dest_addr);
	ssize_t (*senddata)(struct fid_ep *ep, const void *buf, size_t len, void *desc, uint64_t data,
			    fi_addr_t dest_addr, void *context);
	ssize_t (*injectdata)(struct fid_ep *ep, const void *buf, size_t len, uint64_t data, fi_addr_t dest_addr);
};

struct fi_ops_tagged {
	size_t size;
	ssize_t (*recv)(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src_addr, uint64_t tag,
			uint64_t ignore, void *context);
	ssize_t (*recvv)(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count, fi_addr_t src_addr,
			 uint64_t tag, uint64_t ignore, void *context);
	ssize_t (*recvmsg)(struct fid_ep *ep, const struct fi_msg_tagged *msg, uint64_t flags);
	ssize_t (*send)(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest_addr, uint64_t tag,
			void *context);
	ssize_t (*sendv)(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count, fi_addr_t dest_addr,
			 uint64_t tag, void *context);
	ssize_t (*sendmsg)(struct fid_ep *ep, const struct fi_msg_tagged *msg, uint64_t flags);
	ssize_t (*inject)(struct fid_ep *ep, const void *buf, size_t len, fi_addr_t dest_addr, uint64_t tag);
	ssize_t (*senddata)(struct fid_ep *ep, const void *buf, size_t len, void *desc, uint64_t data,
			    fi_addr_t dest_addr, uint64_t tag, void *context);
	ssize_t (*injectdata)(struct fid_ep *ep, const void *buf, size_t len, uint64_t data, fi_addr_t dest_addr,
			      uint64_t tag);
};

struct fi_ops_rma {
	size_t size;
	ssize_t (*read)(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src_addr, uint64_t addr,
			uint64_t key, void *context);
	ssize_t (*readv)(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count, fi_addr_t src_addr,
			 uint64_t addr, uint64_t key, void *context);
	ssize_t (*readmsg)(struct fid_ep *ep, const struct fi_msg_rma *msg, uint64_t flags);
	ssize_t (*write)(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest_addr, uint64_t addr,
			 uint64_t key, void *context);
	ssize_t (*writev)(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count, fi_addr_t dest_addr,
			  uint64_t addr, uint64_t key, void *context);
	ssize_t (*writemsg)(struct fid_ep *ep, const struct fi_msg_rma *msg, uint64_t flags);
	ssize_t (*inject)(struct fid_ep *ep, const void *buf, size_t len, fi_addr_t dest_addr, uint64_t addr,
			  uint64_t key);
	ssize_t (*writedata)(struct fid_ep *ep, const void *buf, size_t len, void *desc, uint64_t data,
			     fi_addr_t dest_addr, uint64_t addr, uint64_t key, void *context);
	ssize_t (*injectdata)(struct fid_ep *ep, const void *buf, size_t len, uint64_t data, fi_addr_t dest_addr,
			      uint64_t addr, uint64_t key);
};

struct fi_ops_atomic {
	size_t size;
	ssize_t (*write)(struct fid_ep *ep, const void *buf, size_t count, void *desc, fi_addr_t dest_addr,
			 uint64_t addr, uint64_t key, enum fi_datatype datatype, enum fi_op op, void *context);
	ssize_t (*writev)(struct fid_ep *ep, const struct fi_ioc *iov, void **desc, size_t count, fi_addr_t dest_addr,
			  uint64_t addr, uint64_t key, enum fi_datatype datatype, enum fi_op op, void *context);
	ssize_t (*writemsg)(struct fid_ep *ep, const struct fi_msg_atomic *msg, uint64_t flags);
	ssize_t (*inject)(struct fid_ep *ep, const void *buf, size_t count, fi_addr_t dest_addr, uint64_t addr,
			  uint64_t key, enum fi_datatype datatype, enum fi_op op);
	ssize_t (*readwrite)(struct fid_ep *ep, const void *buf, size_t count, void *desc, void *result,
			     void *result_desc, fi_addr_t dest_addr, uint64_t addr, uint64_t key,
			     enum fi_datatype datatype, enum fi_op op, void *context);
	ssize_t (*readwritev)(struct fid_ep *ep, const struct fi_ioc *iov, void **desc, size_t count,
			      struct fi_ioc *resultv, void **result_desc, size_t result_count, fi_addr_t dest_addr,
			      uint64_t addr, uint64_t key, enum fi_datatype datatype, enum fi_op op, void *context);
	ssize_t (*readwritemsg)(struct fid_ep *ep, const struct fi_msg_atomic *msg, struct fi_ioc *resultv,
				void **result_desc, size_t result_count, uint64_t flags);
	ssize_t (*compwrite)(struct fid_ep *ep, const void *buf, size_t count, void *desc, const void *compare,
			     void *compare_desc, void *result, void *result_desc, fi_addr_t dest_addr, uint64_t addr,
			     uint64_t key, enum fi_datatype datatype, enum fi_op op, void *context);
	ssize_t (*compwritev)(struct fid_ep *ep, const struct fi_ioc *iov, void **desc, size_t count,
			      const struct fi_ioc *comparev, void **compare_desc, size_t compare_count,
			      struct fi_ioc *resultv, void **result_desc, size_t result_count, fi_addr_t dest_addr,
			      uint64_t addr, uint64_t key, enum fi_datatype datatype, enum fi_op op, void *context);
	ssize_t (*compwritemsg)(struct fid_ep *ep, const struct fi_msg_atomic *msg, const struct fi_ioc *comparev,
				void **compare_desc, size_t compare_count, struct fi_ioc *resultv, void **result_desc,
				size_t result_count, uint64_t flags);
	st_fi_unused_fn writevalid;
	st_fi_unused_fn readwritevalid;
	st_fi_unused_fn compwritevalid;
};

struct fi_ops_ep;
struct fi_ops_collective;

struct fid_ep {
	struct fid fid;
	struct fi_ops_ep *ops;
	struct fi_ops_cm *cm;
	struct fi_ops_msg *msg;
	struct fi_ops_rma *rma;
	struct fi_ops_tagged *tagged;
	struct fi_ops_atomic *atomic;
	struct fi_ops_collective *collective;
};

/* ---- the exported function the ofi provider wraps ---- */
int fi_fabric(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context);

#endif /* ST_ABI_FABRIC_H */
