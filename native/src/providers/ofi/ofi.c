/*
 * libfabric provider (F11).
 *
 * Every libfabric data call (fi_send, fi_tsend, fi_write, fi_cq_read, ...)
 * is a static inline in the headers dispatching through a table in the
 * object (ep->msg->send, cq->ops->read).  The only exported entry we need is
 * fi_fabric(); from there each object the library hands out gets private
 * copies of its tables (interpose/optable.c) with wrappers in the slots we
 * trace, and creation calls (domain, endpoint, CQ, AV, MR) are wrapped so
 * their results get patched in turn:
 *
 *   fi_fabric -> fabric->ops {domain, domain2}
 *             -> domain->ops {av_open, cq_open, endpoint}, domain->mr {reg, regv, regattr}
 *             -> ep->msg / ep->tagged / ep->rma / ep->atomic, ep->fid.ops {control}
 *             -> cq->ops {read, readfrom, sread, sreadfrom}   (full and aggregate modes)
 *             -> av->ops {insert}
 *
 * Tables are copied per object so the copy's header carries the object's
 * state (id, CQ entry format) and wrappers find it in O(1).  Objects created
 * while a wrapper is already running (a utility provider such as ofi_rxm
 * opening core endpoints underneath) are not patched, so one application
 * call is one event.
 *
 * Recording rules (docs/tracer.md): operations are recorded when the
 * provider accepted them (return 0); -FI_EAGAIN retries are not operations.
 * Simple mode writes the EXT record only when it carries information (a
 * peer fi_addr for unconnected endpoints, a tag, a remote address); full
 * mode always writes it (the context pairs posts with completions).
 */
#include <errno.h>
#include <string.h>
#include <stdlib.h>

#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include "interpose/interpose.h"

enum { V_PLAIN = 0, V_VEC = 1, V_MSG = 2, V_INJECT = 3, V_DATA = 4, V_INJECTDATA = 5 };

struct ofi_obj {
	uint32_t id;
	uint32_t addr_format; /* domain/AV: info->addr_format */
	size_t addrlen;       /* domain/AV: bytes per address */
	int cq_format;        /* CQ */
	size_t cq_stride;     /* CQ: bytes per entry, 0 = unknown */
	int connected;        /* EP: FI_EP_MSG */
	void *installed[8];   /* EP: our copies, to notice a provider swapping its tables */
};

/* ---- helpers ------------------------------------------------------------------ */

static struct ofi_obj *obj_new(void)
{
	struct ofi_obj *o = calloc(1, sizeof(*o));
	if (o)
		o->id = st_obj_next_id();
	return o;
}

static size_t dt_size(enum fi_datatype dt)
{
	static const unsigned char sz[] = {1, 1, 2, 2, 4, 4, 8, 8, 4, 8, 8, 16, 16, 32, 16, 16};
	return (unsigned)dt < sizeof(sz) ? sz[dt] : 0;
}

static size_t iov_bytes(const struct iovec *iov, size_t n)
{
	size_t b = 0;
	for (size_t i = 0; iov && i < n; i++)
		b += iov[i].iov_len;
	return b;
}

static size_t ioc_bytes(const struct fi_ioc *ioc, size_t n, enum fi_datatype dt)
{
	size_t b = 0;
	for (size_t i = 0; ioc && i < n; i++)
		b += ioc[i].count;
	return b * dt_size(dt);
}

/* One posted operation.  t0: TSC before the call. */
static inline void ofi_op(uint64_t t0, uint16_t type, uint16_t aux, const struct ofi_obj *o, uint64_t bytes,
			  fi_addr_t addr, uint64_t x3, int info_ext)
{
	int saved = errno;
	uint32_t id = o ? o->id : 0;
	/* a connected endpoint ignores the address: its peer is in OFI_ENDPOINT */
	if (o && o->connected)
		addr = FI_ADDR_UNSPEC;
	if (st_aggregate()) {
		st_agg_add(type, aux, id, addr == FI_ADDR_UNSPEC ? 0 : addr, bytes);
	} else if (info_ext || addr != FI_ADDR_UNSPEC || st_full()) {
		struct st_event *e = st_reserve(2);
		if (e) {
			e[0] = (struct st_event){t0, type, aux, id, bytes};
			e[1] = (struct st_event){addr, ST_EV_EXT, 0, 0, x3};
			st_commit();
		}
	} else {
		struct st_event *e = st_reserve(1);
		if (e) {
			e[0] = (struct st_event){t0, type, aux, id, bytes};
			st_commit();
		}
	}
	errno = saved;
}

static void side_info(struct st_json *j, const struct fi_info *info)
{
	if (!info)
		return;
	if (info->fabric_attr) {
		st_json_str(j, "provider", info->fabric_attr->prov_name);
		st_json_str(j, "fabric", info->fabric_attr->name);
	}
	if (info->domain_attr)
		st_json_str(j, "domain", info->domain_attr->name);
	if (info->ep_attr)
		st_json_str(j, "ep_type", info->ep_attr->type == FI_EP_MSG	 ? "msg"
					  : info->ep_attr->type == FI_EP_RDM ? "rdm"
					  : info->ep_attr->type == FI_EP_DGRAM ? "dgram"
										: "other");
	st_json_hex(j, "caps", info->caps);
	st_json_uint(j, "addr_format", info->addr_format);
	st_json_sockaddr(j, "src_addr", info->src_addr, info->src_addrlen);
	st_json_sockaddr(j, "dest_addr", info->dest_addr, info->dest_addrlen);
}

static void record_create(uint16_t type, uint32_t id, const struct fi_info *info, const char *extra_key,
			  long long extra_val)
{
	int saved = errno;
	char buf[2048];
	struct st_json j;
	st_json_init(&j, buf, sizeof(buf));
	st_json_open(&j, NULL, '{');
	st_json_uint(&j, "id", id);
	side_info(&j, info);
	if (extra_key)
		st_json_int(&j, extra_key, extra_val);
	st_json_close(&j, '}');
	uint64_t sid = j.overflow ? 0 : st_side_json(buf, j.len);
	st_ev(type, 0, id, sid);
	errno = saved;
}

#define ORIG(tbl, T) ((const T *)st_optable_orig(tbl))
#define OWNER(tbl) ((struct ofi_obj *)st_optable_owner(tbl))

/* ---- fi_ops_msg ------------------------------------------------------------------ */

#define BEGIN_OP(slot, T)                                                   \
	const T *o_ = ORIG(ep->slot, T);                                    \
	struct ofi_obj *s_ = OWNER(ep->slot);                               \
	ssize_t r_;                                                          \
	uint64_t t0_ = 0;                                                    \
	int top_ = st_enter();                                               \
	if (top_ && !st_aggregate()) /* counters need no timestamp */        \
		t0_ = st_tsc();
#define END_OP(rec)          \
	st_leave();          \
	if (top_ && r_ == 0) \
		rec;         \
	return r_;

static ssize_t m_recv(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src, void *ctx)
{
	BEGIN_OP(msg, struct fi_ops_msg)
	r_ = o_->recv(ep, buf, len, desc, src, ctx);
	END_OP(ofi_op(t0_, ST_EV_OFI_RECV, V_PLAIN, s_, len, src, (uintptr_t)ctx, 0))
}
static ssize_t m_recvv(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count, fi_addr_t src, void *ctx)
{
	BEGIN_OP(msg, struct fi_ops_msg)
	r_ = o_->recvv(ep, iov, desc, count, src, ctx);
	END_OP(ofi_op(t0_, ST_EV_OFI_RECV, V_VEC, s_, iov_bytes(iov, count), src, (uintptr_t)ctx, 0))
}
static ssize_t m_recvmsg(struct fid_ep *ep, const struct fi_msg *msg, uint64_t flags)
{
	BEGIN_OP(msg, struct fi_ops_msg)
	r_ = o_->recvmsg(ep, msg, flags);
	END_OP(ofi_op(t0_, ST_EV_OFI_RECV, V_MSG, s_, iov_bytes(msg->msg_iov, msg->iov_count), msg->addr,
		      (uintptr_t)msg->context, 0))
}
static ssize_t m_send(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest, void *ctx)
{
	BEGIN_OP(msg, struct fi_ops_msg)
	r_ = o_->send(ep, buf, len, desc, dest, ctx);
	END_OP(ofi_op(t0_, ST_EV_OFI_SEND, V_PLAIN, s_, len, dest, (uintptr_t)ctx, 0))
}
static ssize_t m_sendv(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count, fi_addr_t dest, void *ctx)
{
	BEGIN_OP(msg, struct fi_ops_msg)
	r_ = o_->sendv(ep, iov, desc, count, dest, ctx);
	END_OP(ofi_op(t0_, ST_EV_OFI_SEND, V_VEC, s_, iov_bytes(iov, count), dest, (uintptr_t)ctx, 0))
}
static ssize_t m_sendmsg(struct fid_ep *ep, const struct fi_msg *msg, uint64_t flags)
{
	BEGIN_OP(msg, struct fi_ops_msg)
	r_ = o_->sendmsg(ep, msg, flags);
	END_OP(ofi_op(t0_, ST_EV_OFI_SEND, V_MSG, s_, iov_bytes(msg->msg_iov, msg->iov_count), msg->addr,
		      (uintptr_t)msg->context, 0))
}
static ssize_t m_inject(struct fid_ep *ep, const void *buf, size_t len, fi_addr_t dest)
{
	BEGIN_OP(msg, struct fi_ops_msg)
	r_ = o_->inject(ep, buf, len, dest);
	END_OP(ofi_op(t0_, ST_EV_OFI_SEND, V_INJECT, s_, len, dest, 0, 0))
}
static ssize_t m_senddata(struct fid_ep *ep, const void *buf, size_t len, void *desc, uint64_t data, fi_addr_t dest,
			  void *ctx)
{
	BEGIN_OP(msg, struct fi_ops_msg)
	r_ = o_->senddata(ep, buf, len, desc, data, dest, ctx);
	END_OP(ofi_op(t0_, ST_EV_OFI_SEND, V_DATA, s_, len, dest, (uintptr_t)ctx, 0))
}
static ssize_t m_injectdata(struct fid_ep *ep, const void *buf, size_t len, uint64_t data, fi_addr_t dest)
{
	BEGIN_OP(msg, struct fi_ops_msg)
	r_ = o_->injectdata(ep, buf, len, data, dest);
	END_OP(ofi_op(t0_, ST_EV_OFI_SEND, V_INJECTDATA, s_, len, dest, 0, 0))
}

/* ---- fi_ops_tagged (EXT: x0=peer, x3=tag) ------------------------------------------ */

static ssize_t t_recv(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src, uint64_t tag,
		      uint64_t ignore, void *ctx)
{
	BEGIN_OP(tagged, struct fi_ops_tagged)
	r_ = o_->recv(ep, buf, len, desc, src, tag, ignore, ctx);
	END_OP(ofi_op(t0_, ST_EV_OFI_TRECV, V_PLAIN, s_, len, src, tag, 1))
}
static ssize_t t_recvv(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count, fi_addr_t src,
		       uint64_t tag, uint64_t ignore, void *ctx)
{
	BEGIN_OP(tagged, struct fi_ops_tagged)
	r_ = o_->recvv(ep, iov, desc, count, src, tag, ignore, ctx);
	END_OP(ofi_op(t0_, ST_EV_OFI_TRECV, V_VEC, s_, iov_bytes(iov, count), src, tag, 1))
}
static ssize_t t_recvmsg(struct fid_ep *ep, const struct fi_msg_tagged *msg, uint64_t flags)
{
	BEGIN_OP(tagged, struct fi_ops_tagged)
	r_ = o_->recvmsg(ep, msg, flags);
	END_OP(ofi_op(t0_, ST_EV_OFI_TRECV, V_MSG, s_, iov_bytes(msg->msg_iov, msg->iov_count), msg->addr, msg->tag, 1))
}
static ssize_t t_send(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest, uint64_t tag,
		      void *ctx)
{
	BEGIN_OP(tagged, struct fi_ops_tagged)
	r_ = o_->send(ep, buf, len, desc, dest, tag, ctx);
	END_OP(ofi_op(t0_, ST_EV_OFI_TSEND, V_PLAIN, s_, len, dest, tag, 1))
}
static ssize_t t_sendv(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count, fi_addr_t dest,
		       uint64_t tag, void *ctx)
{
	BEGIN_OP(tagged, struct fi_ops_tagged)
	r_ = o_->sendv(ep, iov, desc, count, dest, tag, ctx);
	END_OP(ofi_op(t0_, ST_EV_OFI_TSEND, V_VEC, s_, iov_bytes(iov, count), dest, tag, 1))
}
static ssize_t t_sendmsg(struct fid_ep *ep, const struct fi_msg_tagged *msg, uint64_t flags)
{
	BEGIN_OP(tagged, struct fi_ops_tagged)
	r_ = o_->sendmsg(ep, msg, flags);
	END_OP(ofi_op(t0_, ST_EV_OFI_TSEND, V_MSG, s_, iov_bytes(msg->msg_iov, msg->iov_count), msg->addr, msg->tag, 1))
}
static ssize_t t_inject(struct fid_ep *ep, const void *buf, size_t len, fi_addr_t dest, uint64_t tag)
{
	BEGIN_OP(tagged, struct fi_ops_tagged)
	r_ = o_->inject(ep, buf, len, dest, tag);
	END_OP(ofi_op(t0_, ST_EV_OFI_TSEND, V_INJECT, s_, len, dest, tag, 1))
}
static ssize_t t_senddata(struct fid_ep *ep, const void *buf, size_t len, void *desc, uint64_t data, fi_addr_t dest,
			  uint64_t tag, void *ctx)
{
	BEGIN_OP(tagged, struct fi_ops_tagged)
	r_ = o_->senddata(ep, buf, len, desc, data, dest, tag, ctx);
	END_OP(ofi_op(t0_, ST_EV_OFI_TSEND, V_DATA, s_, len, dest, tag, 1))
}
static ssize_t t_injectdata(struct fid_ep *ep, const void *buf, size_t len, uint64_t data, fi_addr_t dest,
			    uint64_t tag)
{
	BEGIN_OP(tagged, struct fi_ops_tagged)
	r_ = o_->injectdata(ep, buf, len, data, dest, tag);
	END_OP(ofi_op(t0_, ST_EV_OFI_TSEND, V_INJECTDATA, s_, len, dest, tag, 1))
}

/* ---- fi_ops_rma (EXT: x0=peer, x3=remote address) ------------------------------------ */

static ssize_t r_read(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src, uint64_t addr,
		      uint64_t key, void *ctx)
{
	BEGIN_OP(rma, struct fi_ops_rma)
	r_ = o_->read(ep, buf, len, desc, src, addr, key, ctx);
	END_OP(ofi_op(t0_, ST_EV_OFI_READ, V_PLAIN, s_, len, src, addr, 1))
}
static ssize_t r_readv(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count, fi_addr_t src,
		       uint64_t addr, uint64_t key, void *ctx)
{
	BEGIN_OP(rma, struct fi_ops_rma)
	r_ = o_->readv(ep, iov, desc, count, src, addr, key, ctx);
	END_OP(ofi_op(t0_, ST_EV_OFI_READ, V_VEC, s_, iov_bytes(iov, count), src, addr, 1))
}
static ssize_t r_readmsg(struct fid_ep *ep, const struct fi_msg_rma *msg, uint64_t flags)
{
	BEGIN_OP(rma, struct fi_ops_rma)
	r_ = o_->readmsg(ep, msg, flags);
	END_OP(ofi_op(t0_, ST_EV_OFI_READ, V_MSG, s_, iov_bytes(msg->msg_iov, msg->iov_count), msg->addr,
		      msg->rma_iov_count ? msg->rma_iov[0].addr : 0, 1))
}
static ssize_t r_write(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest, uint64_t addr,
		       uint64_t key, void *ctx)
{
	BEGIN_OP(rma, struct fi_ops_rma)
	r_ = o_->write(ep, buf, len, desc, dest, addr, key, ctx);
	END_OP(ofi_op(t0_, ST_EV_OFI_WRITE, V_PLAIN, s_, len, dest, addr, 1))
}
static ssize_t r_writev(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count, fi_addr_t dest,
			uint64_t addr, uint64_t key, void *ctx)
{
	BEGIN_OP(rma, struct fi_ops_rma)
	r_ = o_->writev(ep, iov, desc, count, dest, addr, key, ctx);
	END_OP(ofi_op(t0_, ST_EV_OFI_WRITE, V_VEC, s_, iov_bytes(iov, count), dest, addr, 1))
}
static ssize_t r_writemsg(struct fid_ep *ep, const struct fi_msg_rma *msg, uint64_t flags)
{
	BEGIN_OP(rma, struct fi_ops_rma)
	r_ = o_->writemsg(ep, msg, flags);
	END_OP(ofi_op(t0_, ST_EV_OFI_WRITE, V_MSG, s_, iov_bytes(msg->msg_iov, msg->iov_count), msg->addr,
		      msg->rma_iov_count ? msg->rma_iov[0].addr : 0, 1))
}
static ssize_t r_inject(struct fid_ep *ep, const void *buf, size_t len, fi_addr_t dest, uint64_t addr, uint64_t key)
{
	BEGIN_OP(rma, struct fi_ops_rma)
	r_ = o_->inject(ep, buf, len, dest, addr, key);
	END_OP(ofi_op(t0_, ST_EV_OFI_WRITE, V_INJECT, s_, len, dest, addr, 1))
}
static ssize_t r_writedata(struct fid_ep *ep, const void *buf, size_t len, void *desc, uint64_t data, fi_addr_t dest,
			   uint64_t addr, uint64_t key, void *ctx)
{
	BEGIN_OP(rma, struct fi_ops_rma)
	r_ = o_->writedata(ep, buf, len, desc, data, dest, addr, key, ctx);
	END_OP(ofi_op(t0_, ST_EV_OFI_WRITE, V_DATA, s_, len, dest, addr, 1))
}
static ssize_t r_injectdata(struct fid_ep *ep, const void *buf, size_t len, uint64_t data, fi_addr_t dest,
			    uint64_t addr, uint64_t key)
{
	BEGIN_OP(rma, struct fi_ops_rma)
	r_ = o_->injectdata(ep, buf, len, data, dest, addr, key);
	END_OP(ofi_op(t0_, ST_EV_OFI_WRITE, V_INJECTDATA, s_, len, dest, addr, 1))
}

/* ---- fi_ops_atomic (aux = op; EXT: x0=peer, x3=remote address) ------------------------- */

static ssize_t a_write(struct fid_ep *ep, const void *buf, size_t count, void *desc, fi_addr_t dest, uint64_t addr,
		       uint64_t key, enum fi_datatype dt, enum fi_op op, void *ctx)
{
	BEGIN_OP(atomic, struct fi_ops_atomic)
	r_ = o_->write(ep, buf, count, desc, dest, addr, key, dt, op, ctx);
	END_OP(ofi_op(t0_, ST_EV_OFI_ATOMIC, (uint16_t)op, s_, count * dt_size(dt), dest, addr, 1))
}
static ssize_t a_writev(struct fid_ep *ep, const struct fi_ioc *iov, void **desc, size_t count, fi_addr_t dest,
			uint64_t addr, uint64_t key, enum fi_datatype dt, enum fi_op op, void *ctx)
{
	BEGIN_OP(atomic, struct fi_ops_atomic)
	r_ = o_->writev(ep, iov, desc, count, dest, addr, key, dt, op, ctx);
	END_OP(ofi_op(t0_, ST_EV_OFI_ATOMIC, (uint16_t)op, s_, ioc_bytes(iov, count, dt), dest, addr, 1))
}
static ssize_t a_writemsg(struct fid_ep *ep, const struct fi_msg_atomic *msg, uint64_t flags)
{
	BEGIN_OP(atomic, struct fi_ops_atomic)
	r_ = o_->writemsg(ep, msg, flags);
	END_OP(ofi_op(t0_, ST_EV_OFI_ATOMIC, (uint16_t)msg->op, s_, ioc_bytes(msg->msg_iov, msg->iov_count, msg->datatype),
		      msg->addr, msg->rma_iov_count ? msg->rma_iov[0].addr : 0, 1))
}
static ssize_t a_inject(struct fid_ep *ep, const void *buf, size_t count, fi_addr_t dest, uint64_t addr,
			uint64_t key, enum fi_datatype dt, enum fi_op op)
{
	BEGIN_OP(atomic, struct fi_ops_atomic)
	r_ = o_->inject(ep, buf, count, dest, addr, key, dt, op);
	END_OP(ofi_op(t0_, ST_EV_OFI_ATOMIC, (uint16_t)op, s_, count * dt_size(dt), dest, addr, 1))
}
static ssize_t a_readwrite(struct fid_ep *ep, const void *buf, size_t count, void *desc, void *result,
			   void *result_desc, fi_addr_t dest, uint64_t addr, uint64_t key, enum fi_datatype dt,
			   enum fi_op op, void *ctx)
{
	BEGIN_OP(atomic, struct fi_ops_atomic)
	r_ = o_->readwrite(ep, buf, count, desc, result, result_desc, dest, addr, key, dt, op, ctx);
	END_OP(ofi_op(t0_, ST_EV_OFI_ATOMIC, (uint16_t)op, s_, count * dt_size(dt), dest, addr, 1))
}
static ssize_t a_readwritev(struct fid_ep *ep, const struct fi_ioc *iov, void **desc, size_t count,
			    struct fi_ioc *resultv, void **result_desc, size_t result_count, fi_addr_t dest,
			    uint64_t addr, uint64_t key, enum fi_datatype dt, enum fi_op op, void *ctx)
{
	BEGIN_OP(atomic, struct fi_ops_atomic)
	r_ = o_->readwritev(ep, iov, desc, count, resultv, result_desc, result_count, dest, addr, key, dt, op, ctx);
	END_OP(ofi_op(t0_, ST_EV_OFI_ATOMIC, (uint16_t)op, s_, ioc_bytes(iov, count, dt), dest, addr, 1))
}
static ssize_t a_readwritemsg(struct fid_ep *ep, const struct fi_msg_atomic *msg, struct fi_ioc *resultv,
			      void **result_desc, size_t result_count, uint64_t flags)
{
	BEGIN_OP(atomic, struct fi_ops_atomic)
	r_ = o_->readwritemsg(ep, msg, resultv, result_desc, result_count, flags);
	END_OP(ofi_op(t0_, ST_EV_OFI_ATOMIC, (uint16_t)msg->op, s_, ioc_bytes(msg->msg_iov, msg->iov_count, msg->datatype),
		      msg->addr, msg->rma_iov_count ? msg->rma_iov[0].addr : 0, 1))
}
static ssize_t a_compwrite(struct fid_ep *ep, const void *buf, size_t count, void *desc, const void *compare,
			   void *compare_desc, void *result, void *result_desc, fi_addr_t dest, uint64_t addr,
			   uint64_t key, enum fi_datatype dt, enum fi_op op, void *ctx)
{
	BEGIN_OP(atomic, struct fi_ops_atomic)
	r_ = o_->compwrite(ep, buf, count, desc, compare, compare_desc, result, result_desc, dest, addr, key, dt, op,
			   ctx);
	END_OP(ofi_op(t0_, ST_EV_OFI_ATOMIC, (uint16_t)op, s_, count * dt_size(dt), dest, addr, 1))
}
static ssize_t a_compwritev(struct fid_ep *ep, const struct fi_ioc *iov, void **desc, size_t count,
			    const struct fi_ioc *comparev, void **compare_desc, size_t compare_count,
			    struct fi_ioc *resultv, void **result_desc, size_t result_count, fi_addr_t dest,
			    uint64_t addr, uint64_t key, enum fi_datatype dt, enum fi_op op, void *ctx)
{
	BEGIN_OP(atomic, struct fi_ops_atomic)
	r_ = o_->compwritev(ep, iov, desc, count, comparev, compare_desc, compare_count, resultv, result_desc,
			    result_count, dest, addr, key, dt, op, ctx);
	END_OP(ofi_op(t0_, ST_EV_OFI_ATOMIC, (uint16_t)op, s_, ioc_bytes(iov, count, dt), dest, addr, 1))
}
static ssize_t a_compwritemsg(struct fid_ep *ep, const struct fi_msg_atomic *msg, const struct fi_ioc *comparev,
			      void **compare_desc, size_t compare_count, struct fi_ioc *resultv, void **result_desc,
			      size_t result_count, uint64_t flags)
{
	BEGIN_OP(atomic, struct fi_ops_atomic)
	r_ = o_->compwritemsg(ep, msg, comparev, compare_desc, compare_count, resultv, result_desc, result_count, flags);
	END_OP(ofi_op(t0_, ST_EV_OFI_ATOMIC, (uint16_t)msg->op, s_, ioc_bytes(msg->msg_iov, msg->iov_count, msg->datatype),
		      msg->addr, msg->rma_iov_count ? msg->rma_iov[0].addr : 0, 1))
}

/* ---- CQ reads (full mode: every call and every completion; aggregate: counters) ---- */

static void record_cq(uint64_t t0, const struct ofi_obj *s, const void *buf, size_t count, ssize_t ret)
{
	int saved = errno;
	size_t n = ret > 0 ? (size_t)ret : 0;
	if (st_aggregate()) {
		st_agg_add(ST_EV_OFI_CQ_READ, 0, s->id, 0, n);
		for (size_t i = 0; i < n && s->cq_stride; i++) {
			const unsigned char *e = (const unsigned char *)buf + i * s->cq_stride;
			const struct fi_cq_msg_entry *m = (const void *)e;
			if (s->cq_format == FI_CQ_FORMAT_CONTEXT)
				st_agg_add(ST_EV_OFI_COMPLETION, 0, s->id, 0, 0);
			else
				st_agg_add(ST_EV_OFI_COMPLETION, (uint16_t)m->flags, s->id, 0, m->len);
		}
		errno = saved;
		return;
	}
	struct st_event *e = st_reserve(1);
	if (e) {
		*e = (struct st_event){t0, ST_EV_OFI_CQ_READ, (uint16_t)(n > 0xffff ? 0xffff : n), s->id, count};
		st_commit();
	}
	uint64_t now = n ? st_tsc() : 0;
	for (size_t i = 0; i < n; i++) {
		if (!s->cq_stride) { /* unknown format: only the first entry's context is certain */
			if (i == 0 && (e = st_reserve(1))) {
				*e = (struct st_event){now, ST_EV_OFI_COMPLETION, 0, s->id, *(const uint64_t *)buf};
				st_commit();
			}
			break;
		}
		const unsigned char *ent = (const unsigned char *)buf + i * s->cq_stride;
		if (s->cq_format == FI_CQ_FORMAT_CONTEXT) {
			if ((e = st_reserve(1))) {
				*e = (struct st_event){now, ST_EV_OFI_COMPLETION, 0, s->id, *(const uint64_t *)ent};
				st_commit();
			}
		} else {
			const struct fi_cq_msg_entry *m = (const void *)ent;
			if ((e = st_reserve(2))) {
				e[0] = (struct st_event){now, ST_EV_OFI_COMPLETION, (uint16_t)m->flags, s->id,
							 (uintptr_t)m->op_context};
				e[1] = (struct st_event){m->len, ST_EV_EXT, 0, 0, m->flags};
				st_commit();
			}
		}
	}
	errno = saved;
}

#define BEGIN_CQ                                                           \
	const struct fi_ops_cq *o_ = ORIG(cq->ops, struct fi_ops_cq);     \
	struct ofi_obj *s_ = OWNER(cq->ops);                               \
	ssize_t r_;                                                        \
	uint64_t t0_ = st_aggregate() ? 0 : st_tsc();                      \
	int top_ = st_enter();
#define END_CQ                                       \
	st_leave();                                  \
	if (top_)                                    \
		record_cq(t0_, s_, buf, count, r_);  \
	return r_;

static ssize_t c_read(struct fid_cq *cq, void *buf, size_t count)
{
	BEGIN_CQ
	r_ = o_->read(cq, buf, count);
	END_CQ
}
static ssize_t c_readfrom(struct fid_cq *cq, void *buf, size_t count, fi_addr_t *src)
{
	BEGIN_CQ
	r_ = o_->readfrom(cq, buf, count, src);
	END_CQ
}
static ssize_t c_sread(struct fid_cq *cq, void *buf, size_t count, const void *cond, int timeout)
{
	BEGIN_CQ
	r_ = o_->sread(cq, buf, count, cond, timeout);
	END_CQ
}
static ssize_t c_sreadfrom(struct fid_cq *cq, void *buf, size_t count, fi_addr_t *src, const void *cond, int timeout)
{
	BEGIN_CQ
	r_ = o_->sreadfrom(cq, buf, count, src, cond, timeout);
	END_CQ
}

/* ---- patching ---------------------------------------------------------------------------- */

/* Copy *slot (a table of `size` bytes), put wrappers in, install. */
#define PATCH(slot_ptr, T, owner, body)                                          \
	do {                                                                     \
		T *orig_ = *(slot_ptr);                                          \
		if (orig_ && !st_optable_ours(orig_)) {                          \
			size_t sz_ = sizeof(T);                                  \
			if (orig_->size && orig_->size < sz_)                    \
				sz_ = orig_->size;                               \
			T *c_ = st_optable_copy(orig_, sizeof(T), (owner));      \
			if (c_) {                                                \
				if (sz_ < sizeof(T))                             \
					memset((char *)c_ + sz_, 0, sizeof(T) - sz_); \
				body;                                            \
				st_optable_install((slot_ptr), c_);              \
			}                                                        \
		}                                                                \
	} while (0)
#define SET(f, w)            \
	if (orig_->f)        \
	c_->f = w

static void patch_ep_tables(struct fid_ep *ep, struct ofi_obj *s)
{
	PATCH(&ep->msg, struct fi_ops_msg, s, {
		SET(recv, m_recv); SET(recvv, m_recvv); SET(recvmsg, m_recvmsg); SET(send, m_send);
		SET(sendv, m_sendv); SET(sendmsg, m_sendmsg); SET(inject, m_inject); SET(senddata, m_senddata);
		SET(injectdata, m_injectdata);
		s->installed[0] = c_;
	});
	PATCH(&ep->tagged, struct fi_ops_tagged, s, {
		SET(recv, t_recv); SET(recvv, t_recvv); SET(recvmsg, t_recvmsg); SET(send, t_send);
		SET(sendv, t_sendv); SET(sendmsg, t_sendmsg); SET(inject, t_inject); SET(senddata, t_senddata);
		SET(injectdata, t_injectdata);
		s->installed[1] = c_;
	});
	PATCH(&ep->rma, struct fi_ops_rma, s, {
		SET(read, r_read); SET(readv, r_readv); SET(readmsg, r_readmsg); SET(write, r_write);
		SET(writev, r_writev); SET(writemsg, r_writemsg); SET(inject, r_inject); SET(writedata, r_writedata);
		SET(injectdata, r_injectdata);
		s->installed[2] = c_;
	});
	PATCH(&ep->atomic, struct fi_ops_atomic, s, {
		SET(write, a_write); SET(writev, a_writev); SET(writemsg, a_writemsg); SET(inject, a_inject);
		SET(readwrite, a_readwrite); SET(readwritev, a_readwritev); SET(readwritemsg, a_readwritemsg);
		SET(compwrite, a_compwrite); SET(compwritev, a_compwritev); SET(compwritemsg, a_compwritemsg);
		s->installed[3] = c_;
	});
}

/* fi_enable (fi_control(FI_ENABLE)) is where some providers pick their data
 * path tables: patch again whatever changed. */
static int e_control(struct fid *fid, int command, void *arg)
{
	const struct fi_ops *o = ORIG(fid->ops, struct fi_ops);
	struct ofi_obj *s = OWNER(fid->ops);
	int top = st_enter();
	int r = o->control(fid, command, arg);
	st_leave();
	if (top && command == FI_ENABLE && r == 0) {
		int saved = errno;
		patch_ep_tables((struct fid_ep *)fid, s); /* fid is the first member */
		errno = saved;
	}
	return r;
}

static void patch_ep(struct fid_ep *ep, const struct fi_info *info)
{
	struct ofi_obj *s = obj_new();
	if (!s)
		return;
	s->connected = info && info->ep_attr && info->ep_attr->type == FI_EP_MSG;
	record_create(ST_EV_OFI_ENDPOINT, s->id, info, NULL, 0);
	PATCH(&ep->fid.ops, struct fi_ops, s, { SET(control, e_control); });
	patch_ep_tables(ep, s);
}

/* ---- CQ / AV / MR ---------------------------------------------------------------------- */

static size_t cq_stride(enum fi_cq_format f)
{
	switch (f) {
	case FI_CQ_FORMAT_CONTEXT: return sizeof(struct fi_cq_entry);
	case FI_CQ_FORMAT_MSG: return sizeof(struct fi_cq_msg_entry);
	case FI_CQ_FORMAT_DATA: return sizeof(struct fi_cq_data_entry);
	case FI_CQ_FORMAT_TAGGED: return sizeof(struct fi_cq_tagged_entry);
	default: return 0;
	}
}

static void patch_cq(struct fid_cq *cq, const struct fi_cq_attr *attr)
{
	struct ofi_obj *s = obj_new();
	if (!s)
		return;
	s->cq_format = attr ? (int)attr->format : FI_CQ_FORMAT_UNSPEC;
	s->cq_stride = attr ? cq_stride(attr->format) : 0;
	{
		int saved = errno;
		char buf[256];
		struct st_json j;
		st_json_init(&j, buf, sizeof(buf));
		st_json_open(&j, NULL, '{');
		st_json_uint(&j, "id", s->id);
		st_json_int(&j, "format", s->cq_format);
		st_json_uint(&j, "size", attr ? attr->size : 0);
		st_json_close(&j, '}');
		st_ev(ST_EV_OFI_CQ_OPEN, 0, s->id, st_side_json(buf, j.len));
		errno = saved;
	}
	/* Simple mode omits polling: the CQ keeps its own table, zero cost. */
	if (st_cfg.mode == ST_MODE_SIMPLE)
		return;
	PATCH(&cq->ops, struct fi_ops_cq, s, {
		SET(read, c_read); SET(readfrom, c_readfrom); SET(sread, c_sread); SET(sreadfrom, c_sreadfrom);
	});
}

static int v_insert(struct fid_av *av, const void *addr, size_t count, fi_addr_t *fi_addr, uint64_t flags, void *ctx)
{
	const struct fi_ops_av *o = ORIG(av->ops, struct fi_ops_av);
	struct ofi_obj *s = OWNER(av->ops);
	int top = st_enter();
	int r = o->insert(av, addr, count, fi_addr, flags, ctx);
	st_leave();
	if (!top)
		return r;
	int saved = errno;
	char buf[8192];
	struct st_json j;
	st_json_init(&j, buf, sizeof(buf));
	st_json_open(&j, NULL, '{');
	st_json_uint(&j, "av", s->id);
	st_json_uint(&j, "count", count);
	st_json_int(&j, "ret", r);
	st_json_uint(&j, "addr_format", s->addr_format);
	size_t shown = count < 64 ? count : 64;
	st_json_open(&j, "addrs", '[');
	for (size_t i = 0; addr && s->addrlen && i < shown; i++)
		st_json_sockaddr(&j, NULL, (const char *)addr + i * s->addrlen, s->addrlen);
	st_json_close(&j, ']');
	st_json_open(&j, "fi_addrs", '[');
	for (size_t i = 0; fi_addr && r > 0 && i < shown && i < (size_t)r; i++)
		st_json_uint(&j, NULL, fi_addr[i]);
	st_json_close(&j, ']');
	st_json_close(&j, '}');
	uint64_t sid = j.overflow ? 0 : st_side_json(buf, j.len);
	st_ev(ST_EV_OFI_AV_INSERT, (uint16_t)(r > 0 ? (r > 0xffff ? 0xffff : r) : 0), s->id, sid);
	errno = saved;
	return r;
}

static void record_mr(uint64_t t0, struct fid_mr *mr, const void *addr, size_t len)
{
	int saved = errno;
	uint32_t id = st_obj_next_id();
	if (st_aggregate()) {
		st_ev(ST_EV_OFI_MR_REG, 0, id, (uintptr_t)addr);
	} else {
		struct st_event *e = st_reserve(2);
		if (e) {
			e[0] = (struct st_event){t0, ST_EV_OFI_MR_REG, 0, id, (uintptr_t)addr};
			e[1] = (struct st_event){len, ST_EV_EXT, 0, 0, mr ? mr->key : 0};
			st_commit();
		}
	}
	errno = saved;
}

static int mr_reg(struct fid *fid, const void *buf, size_t len, uint64_t access, uint64_t offset,
		  uint64_t requested_key, uint64_t flags, struct fid_mr **mr, void *ctx)
{
	struct fid_domain *d = (struct fid_domain *)fid;
	const struct fi_ops_mr *o = ORIG(d->mr, struct fi_ops_mr);
	uint64_t t0 = st_tsc();
	int top = st_enter();
	int r = o->reg(fid, buf, len, access, offset, requested_key, flags, mr, ctx);
	st_leave();
	if (top && r == 0)
		record_mr(t0, *mr, buf, len);
	return r;
}

static int mr_regv(struct fid *fid, const struct iovec *iov, size_t count, uint64_t access, uint64_t offset,
		   uint64_t requested_key, uint64_t flags, struct fid_mr **mr, void *ctx)
{
	struct fid_domain *d = (struct fid_domain *)fid;
	const struct fi_ops_mr *o = ORIG(d->mr, struct fi_ops_mr);
	uint64_t t0 = st_tsc();
	int top = st_enter();
	int r = o->regv(fid, iov, count, access, offset, requested_key, flags, mr, ctx);
	st_leave();
	if (top && r == 0)
		record_mr(t0, *mr, count ? iov[0].iov_base : NULL, iov_bytes(iov, count));
	return r;
}

static int mr_regattr(struct fid *fid, const struct fi_mr_attr *attr, uint64_t flags, struct fid_mr **mr)
{
	struct fid_domain *d = (struct fid_domain *)fid;
	const struct fi_ops_mr *o = ORIG(d->mr, struct fi_ops_mr);
	uint64_t t0 = st_tsc();
	int top = st_enter();
	int r = o->regattr(fid, attr, flags, mr);
	st_leave();
	if (top && r == 0 && attr)
		record_mr(t0, *mr, attr->iov_count ? attr->mr_iov[0].iov_base : NULL,
			  iov_bytes(attr->mr_iov, attr->iov_count));
	return r;
}

/* ---- domain ops ------------------------------------------------------------------------------ */

static int d_av_open(struct fid_domain *domain, struct fi_av_attr *attr, struct fid_av **av, void *ctx)
{
	const struct fi_ops_domain *o = ORIG(domain->ops, struct fi_ops_domain);
	struct ofi_obj *ds = OWNER(domain->ops);
	int top = st_enter();
	int r = o->av_open(domain, attr, av, ctx);
	st_leave();
	if (top && r == 0 && *av) {
		int saved = errno;
		struct ofi_obj *s = obj_new();
		if (s) {
			s->addr_format = ds->addr_format;
			s->addrlen = ds->addrlen;
			PATCH(&(*av)->ops, struct fi_ops_av, s, { SET(insert, v_insert); });
		}
		errno = saved;
	}
	return r;
}

static int d_cq_open(struct fid_domain *domain, struct fi_cq_attr *attr, struct fid_cq **cq, void *ctx)
{
	const struct fi_ops_domain *o = ORIG(domain->ops, struct fi_ops_domain);
	int top = st_enter();
	int r = o->cq_open(domain, attr, cq, ctx);
	st_leave();
	if (top && r == 0 && *cq) {
		int saved = errno;
		patch_cq(*cq, attr);
		errno = saved;
	}
	return r;
}

static int d_endpoint(struct fid_domain *domain, struct fi_info *info, struct fid_ep **ep, void *ctx)
{
	const struct fi_ops_domain *o = ORIG(domain->ops, struct fi_ops_domain);
	int top = st_enter();
	int r = o->endpoint(domain, info, ep, ctx);
	st_leave();
	if (top && r == 0 && *ep) {
		int saved = errno;
		patch_ep(*ep, info);
		errno = saved;
	}
	return r;
}

static void patch_domain(struct fid_domain *dom, const struct fi_info *info)
{
	struct ofi_obj *s = obj_new();
	if (!s)
		return;
	s->addr_format = info ? info->addr_format : 0;
	s->addrlen = info ? (info->src_addrlen ? info->src_addrlen : info->dest_addrlen) : 0;
	record_create(ST_EV_OFI_DOMAIN, s->id, info, NULL, 0);
	PATCH(&dom->ops, struct fi_ops_domain, s, {
		SET(av_open, d_av_open); SET(cq_open, d_cq_open); SET(endpoint, d_endpoint);
	});
	PATCH(&dom->mr, struct fi_ops_mr, s, { SET(reg, mr_reg); SET(regv, mr_regv); SET(regattr, mr_regattr); });
}

/* ---- fabric ops -------------------------------------------------------------------------------- */

static int f_domain(struct fid_fabric *fabric, struct fi_info *info, struct fid_domain **dom, void *ctx)
{
	const struct fi_ops_fabric *o = ORIG(fabric->ops, struct fi_ops_fabric);
	int top = st_enter();
	int r = o->domain(fabric, info, dom, ctx);
	st_leave();
	if (top && r == 0 && *dom) {
		int saved = errno;
		patch_domain(*dom, info);
		errno = saved;
	}
	return r;
}

static int f_domain2(struct fid_fabric *fabric, struct fi_info *info, struct fid_domain **dom, uint64_t flags,
		     void *ctx)
{
	const struct fi_ops_fabric *o = ORIG(fabric->ops, struct fi_ops_fabric);
	int top = st_enter();
	int r = o->domain2(fabric, info, dom, flags, ctx);
	st_leave();
	if (top && r == 0 && *dom) {
		int saved = errno;
		patch_domain(*dom, info);
		errno = saved;
	}
	return r;
}

/* ---- the exported entry point ---------------------------------------------------------------------- */

static int (*real_fi_fabric)(struct fi_fabric_attr *, struct fid_fabric **, void *);

ST_EXPORT int fi_fabric(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context)
{
	if (!ST_REAL(real_fi_fabric, "fi_fabric"))
		return -FI_ENOSYS;
	if (!st_provider_on(ST_PROV_OFI) || st_tls_depth)
		return real_fi_fabric(attr, fabric, context);
	int top = st_enter();
	int r = real_fi_fabric(attr, fabric, context);
	st_leave();
	if (top && r == 0 && *fabric) {
		int saved = errno;
		struct ofi_obj *s = obj_new();
		if (s) {
			char buf[512];
			struct st_json j;
			st_json_init(&j, buf, sizeof(buf));
			st_json_open(&j, NULL, '{');
			st_json_uint(&j, "id", s->id);
			st_json_str(&j, "provider", attr ? attr->prov_name : NULL);
			st_json_str(&j, "name", attr ? attr->name : NULL);
			st_json_hex(&j, "prov_version", attr ? attr->prov_version : 0);
			st_json_close(&j, '}');
			st_ev(ST_EV_OFI_FABRIC, 0, s->id, st_side_json(buf, j.len));
			PATCH(&(*fabric)->ops, struct fi_ops_fabric, s, { SET(domain, f_domain); SET(domain2, f_domain2); });
		}
		errno = saved;
	}
	return r;
}

static const struct st_hook ofi_hooks[] = {
	{"fi_fabric", (void *)fi_fabric, (void **)&real_fi_fabric, ST_PROV_OFI},
};

__attribute__((constructor(200))) static void ofi_init(void)
{
	st_hooks_register(ofi_hooks, sizeof(ofi_hooks) / sizeof(ofi_hooks[0]));
}
