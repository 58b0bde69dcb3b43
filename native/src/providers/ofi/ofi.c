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
 * The slots and what each records are one table, ofi_ops.def (X-macros):
 * the wrappers, and the lists of slots a copied table gets, are generated
 * from it.  The few irregular wrappers (ep control, AV insert, AV open) are
 * written out.
 *
 * Recording rules (docs/tracer.md): operations are recorded when the
 * provider accepted them (return 0); -FI_EAGAIN retries are not operations.
 * Simple mode writes the EXT record only when it carries information (a
 * peer fi_addr for unconnected endpoints, a tag, a remote address); full
 * mode always writes it (the context pairs posts with completions).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>

#include "abi/fabric.h"

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
	struct ofi_obj *state = calloc(1, sizeof(*state));
	if (state)
		state->id = st_obj_next_id();
	return state;
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

/* One posted operation.  t0: TSC before the call.  Like record_cq, it leaves
 * errno alone without saving it: the record paths of core.h keep it. */
static inline void ofi_op(uint64_t t0, uint16_t type, uint16_t aux, const struct ofi_obj *state, uint64_t bytes,
			  fi_addr_t addr, uint64_t x3, int info_ext)
{
	uint32_t id = state ? state->id : 0;
	/* a connected endpoint ignores the address: its peer is in OFI_ENDPOINT */
	if (state && state->connected)
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
	st_json_begin_object(&j, buf, sizeof(buf));
	st_json_uint(&j, "id", id);
	side_info(&j, info);
	if (extra_key)
		st_json_int(&j, extra_key, extra_val);
	st_json_close(&j, '}');
	uint64_t sid = j.overflow ? 0 : st_side_json(buf, j.len);
	st_ev(type, 0, id, sid);
	errno = saved;
}

#define ORIG(table, type) ((const type *)st_optable_orig(table))
#define OWNER(table) ((struct ofi_obj *)st_optable_owner(table))

/* ---- what the wrappers record -------------------------------------------------------- */

/* The completions a CQ read returned (n > 0): out of line, so that the read
 * of an empty CQ (a polling loop) is recorded by the wrapper itself. */
static void record_completions(const struct ofi_obj *cq, const void *buf, size_t n)
{
	if (st_aggregate()) {
		for (size_t i = 0; i < n && cq->cq_stride; i++) {
			const unsigned char *e = (const unsigned char *)buf + i * cq->cq_stride;
			const struct fi_cq_msg_entry *m = (const void *)e;
			if (cq->cq_format == FI_CQ_FORMAT_CONTEXT)
				st_agg_add(ST_EV_OFI_COMPLETION, 0, cq->id, 0, 0);
			else
				st_agg_add(ST_EV_OFI_COMPLETION, (uint16_t)m->flags, cq->id, 0, m->len);
		}
		return;
	}
	struct st_event *e;
	uint64_t now = st_tsc();
	for (size_t i = 0; i < n; i++) {
		if (!cq->cq_stride) { /* unknown format: only the first entry's context is certain */
			if (i == 0 && (e = st_reserve(1))) {
				*e = (struct st_event){now, ST_EV_OFI_COMPLETION, 0, cq->id, *(const uint64_t *)buf};
				st_commit();
			}
			break;
		}
		const unsigned char *ent = (const unsigned char *)buf + i * cq->cq_stride;
		if (cq->cq_format == FI_CQ_FORMAT_CONTEXT) {
			if ((e = st_reserve(1))) {
				*e = (struct st_event){now, ST_EV_OFI_COMPLETION, 0, cq->id, *(const uint64_t *)ent};
				st_commit();
			}
		} else {
			const struct fi_cq_msg_entry *m = (const void *)ent;
			if ((e = st_reserve(2))) {
				e[0] = (struct st_event){now, ST_EV_OFI_COMPLETION, (uint16_t)m->flags, cq->id,
							 (uintptr_t)m->op_context};
				e[1] = (struct st_event){m->len, ST_EV_EXT, 0, 0, m->flags};
				st_commit();
			}
		}
	}
}

/* CQ reads: full mode, every call (a run of empty ones as its first and last, st_idle_poll) and every
 * completion; aggregate: counters */
static inline __attribute__((always_inline)) void record_cq(uint64_t t0, const struct ofi_obj *cq, const void *buf,
							    size_t count, ssize_t ret)
{
	size_t n = ret > 0 ? (size_t)ret : 0;
	if (st_aggregate()) {
		st_agg_add(ST_EV_OFI_CQ_READ, 0, cq->id, 0, n);
	} else if (!n) {
		/* requested: its low 32 bits (the high ones carry the polls of a coalesced run) */
		st_idle_poll(t0, ST_EV_OFI_CQ_READ, cq->id, (uint32_t)count);
	} else {
		struct st_event *e = st_reserve(1);
		if (e) {
			*e = (struct st_event){t0, ST_EV_OFI_CQ_READ, (uint16_t)(n > 0xffff ? 0xffff : n), cq->id,
					       (uint32_t)count};
			st_commit();
		}
	}
	if (unlikely(n))
		record_completions(cq, buf, n);
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

static void patch_ep(struct fid_ep *ep, const struct fi_info *info);
static void patch_cq(struct fid_cq *cq, const struct fi_cq_attr *attr);
static void patch_domain(struct fid_domain *dom, const struct fi_info *info);

/* ---- the wrappers of ofi_ops.def --------------------------------------------------------- */

/* Endpoint data operations.  Counters need no timestamp (aggregate mode).
 * The data wrappers forward a call made from inside the library (a utility
 * provider calling the core one through the patched table) first, as a tail
 * call: no frame, no stamp, no depth change (depth is already raised); the
 * recording path is a function of its own so that this one needs no frame
 * (GCC does not shrink-wrap the callee-saved registers of the recording
 * path away from the forwarding one). */
#define ST_OFI_EP_OP(table, slot, params, args, type, aux, bytes, peer, x3, info_ext)      \
	static __attribute__((noinline)) ssize_t ep_##table##_##slot##_top params          \
	{                                                                                  \
		const struct fi_ops_##table *ops = ORIG(ep->table, struct fi_ops_##table); \
		struct ofi_obj *owner = OWNER(ep->table);                                  \
		uint64_t t0 = st_aggregate() ? 0 : st_tsc();                               \
		st_enter();                                                                \
		ssize_t ret = ops->slot args;                                              \
		st_leave();                                                                \
		if (ret == 0)                                                              \
			ofi_op(t0, type, aux, owner, bytes, peer, x3, info_ext);           \
		return ret;                                                                \
	}                                                                                  \
	static ssize_t ep_##table##_##slot params                                          \
	{                                                                                  \
		if (unlikely(st_nested()))                                                 \
			return ORIG(ep->table, struct fi_ops_##table)->slot args;          \
		return ep_##table##_##slot##_top args;                                     \
	}

#define ST_OFI_CQ_READ(slot, params, args)                                     \
	static __attribute__((noinline)) ssize_t cq_##slot##_top params        \
	{                                                                      \
		const struct fi_ops_cq *ops = ORIG(cq->ops, struct fi_ops_cq); \
		struct ofi_obj *owner = OWNER(cq->ops);                        \
		uint64_t t0 = st_aggregate() ? 0 : st_tsc();                   \
		st_enter();                                                    \
		ssize_t ret = ops->slot args;                                  \
		st_leave();                                                    \
		record_cq(t0, owner, buf, count, ret);                         \
		return ret;                                                    \
	}                                                                      \
	static ssize_t cq_##slot params                                        \
	{                                                                      \
		if (unlikely(st_nested()))                                     \
			return ORIG(cq->ops, struct fi_ops_cq)->slot args;     \
		return cq_##slot##_top args;                                   \
	}

#define ST_OFI_MR_REG(slot, params, args, valid, addr, len)                         \
	static int mr_##slot params                                                 \
	{                                                                           \
		struct fid_domain *domain = (struct fid_domain *)fid;               \
		const struct fi_ops_mr *ops = ORIG(domain->mr, struct fi_ops_mr);   \
		uint64_t t0 = st_tsc();                                             \
		int top = st_enter();                                               \
		int ret = ops->slot args;                                           \
		st_leave();                                                         \
		if (top && ret == 0 && (valid))                                     \
			record_mr(t0, *mr, addr, len);                              \
		return ret;                                                         \
	}

/* Objects created while a wrapper already runs (a utility provider opening
 * core objects underneath) are not patched: top is 0 there. */
#define ST_OFI_OPEN(self, slot, params, args, created, patch)                            \
	static int self##_##slot params                                                  \
	{                                                                                \
		const struct fi_ops_##self *ops = ORIG(self->ops, struct fi_ops_##self); \
		int top = st_enter();                                                    \
		int ret = ops->slot args;                                                \
		st_leave();                                                              \
		if (top && ret == 0 && (created)) {                                      \
			int saved = errno;                                               \
			patch;                                                           \
			errno = saved;                                                   \
		}                                                                        \
		return ret;                                                              \
	}

#include "ofi_ops.def"

/* ---- patching ---------------------------------------------------------------------------- */

/* Copy *slot_ptr (a table of `type`), put wrappers in (the SET rows between
 * BEGIN and END), install.  A table shorter than ours (an older provider;
 * its size field says so) gets the rest zeroed: those slots stay empty. */
#define PATCH_BEGIN(slot_ptr, type, owner)                                         \
	do {                                                                       \
		type *orig = *(slot_ptr);                                          \
		if (orig && !st_optable_ours(orig)) {                              \
			size_t size = sizeof(type);                                \
			if (orig->size && orig->size < size)                       \
				size = orig->size;                                 \
			type *copy = st_optable_copy(orig, sizeof(type), (owner)); \
			if (copy) {                                                \
				if (size < sizeof(type))                           \
					memset((char *)copy + size, 0, sizeof(type) - size);
#define PATCH_END(slot_ptr)                                           \
				st_optable_install((slot_ptr), copy); \
			}                                             \
		}                                                     \
	} while (0)
#define PATCH(slot_ptr, type, owner, body) \
	PATCH_BEGIN(slot_ptr, type, owner) body; PATCH_END(slot_ptr)
/* a slot the provider left empty stays empty */
#define SET(slot, wrapper) \
	if (orig->slot)    \
	copy->slot = wrapper

static void patch_ep_tables(struct fid_ep *ep, struct ofi_obj *state)
{
#define ST_OFI_EP_TABLE(table, index) PATCH_BEGIN(&ep->table, struct fi_ops_##table, state)
#define ST_OFI_EP_OP(table, slot, ...) SET(slot, ep_##table##_##slot);
#define ST_OFI_EP_TABLE_END(table, index) \
	state->installed[index] = copy;   \
	PATCH_END(&ep->table);
#include "ofi_ops.def"
}

/* Give the provider its own tables back, where ours are installed (before fi_close, and around fi_enable,
 * where a provider may free or replace them): a provider may own its tables -- libfabric 1.17's verbs msg
 * endpoint frees per-endpoint ops tables at close, and freed our copies instead (an invalid free: glibc
 * aborted the traced fi_pingpong, test_fi_pingpong_verbs_traced[verbs-msg]). */
static void unpatch_ep_tables(struct fid_ep *ep, struct ofi_obj *state)
{
#define ST_OFI_EP_TABLE(table, index)                                         \
	if (state->installed[index] && (void *)ep->table == state->installed[index]) \
		st_optable_install(&ep->table, (void *)st_optable_orig(ep->table));
#define ST_OFI_EP_OP(table, slot, ...)
#define ST_OFI_EP_TABLE_END(table, index)
#include "ofi_ops.def"
}

/* The other way: our copies back where the provider kept its table, a new copy where it put another. */
static void repatch_ep_tables(struct fid_ep *ep, struct ofi_obj *state)
{
#define ST_OFI_EP_TABLE(table, index)                                                            \
	if (state->installed[index] && (const void *)ep->table == st_optable_orig(state->installed[index])) \
		st_optable_install(&ep->table, state->installed[index]);
#define ST_OFI_EP_OP(table, slot, ...)
#define ST_OFI_EP_TABLE_END(table, index)
#include "ofi_ops.def"
	patch_ep_tables(ep, state);
}

static int ep_close(struct fid *fid)
{
	void *copy = fid->ops;
	const struct fi_ops *ops = ORIG(fid->ops, struct fi_ops);
	struct ofi_obj *state = OWNER(fid->ops);
	unpatch_ep_tables((struct fid_ep *)fid, state);
	st_optable_install(&fid->ops, (void *)ops);
	int top = st_enter();
	int ret = ops->close(fid);
	st_leave();
	if (ret != 0 && top) { /* still open (busy): traced again */
		int saved = errno;
		st_optable_install(&fid->ops, copy);
		repatch_ep_tables((struct fid_ep *)fid, state);
		errno = saved;
	}
	return ret;
}

/* The address an endpoint is bound to once enabled (its fi_info's src_addr often has port 0): a second
 * OFI_ENDPOINT record {"id", "src_addr", "bound": true}, the address its peers put in their AVs, so the
 * correlator can tell which process an fi_addr names. */
static void record_bound_name(struct fid_ep *ep, const struct ofi_obj *state)
{
	char name[128];
	size_t len = sizeof(name);
	if (!ep->cm || !ep->cm->getname)
		return;
	st_enter();
	int r = ep->cm->getname(&ep->fid, name, &len);
	st_leave();
	if (r != 0 || len > sizeof(name))
		return;
	char buf[512];
	struct st_json j;
	st_json_begin_object(&j, buf, sizeof(buf));
	st_json_uint(&j, "id", state->id);
	st_json_sockaddr(&j, "src_addr", name, len);
	st_json_bool(&j, "bound", 1);
	st_json_close(&j, '}');
	if (!j.overflow)
		st_ev(ST_EV_OFI_ENDPOINT, 0, state->id, st_side_json(buf, j.len));
}

/* fi_enable (fi_control(FI_ENABLE)) is where some providers pick their data
 * path tables: patch again whatever changed. */
static int ep_control(struct fid *fid, int command, void *arg)
{
	const struct fi_ops *ops = ORIG(fid->ops, struct fi_ops);
	struct ofi_obj *state = OWNER(fid->ops);
	int enable = command == FI_ENABLE;
	if (enable)
		unpatch_ep_tables((struct fid_ep *)fid, state); /* fid is the first member */
	int top = st_enter();
	int ret = ops->control(fid, command, arg);
	st_leave();
	if (enable) {
		int saved = errno;
		repatch_ep_tables((struct fid_ep *)fid, state); /* what it holds now (enabled or not) */
		if (top && ret == 0)
			record_bound_name((struct fid_ep *)fid, state);
		errno = saved;
	}
	return ret;
}

static void patch_ep(struct fid_ep *ep, const struct fi_info *info)
{
	struct ofi_obj *state = obj_new();
	if (!state)
		return;
	state->connected = info && info->ep_attr && info->ep_attr->type == FI_EP_MSG;
	record_create(ST_EV_OFI_ENDPOINT, state->id, info, NULL, 0);
	PATCH(&ep->fid.ops, struct fi_ops, state, {
		SET(control, ep_control);
		SET(close, ep_close);
	});
	patch_ep_tables(ep, state);
}

/* ---- CQ / AV / domain ------------------------------------------------------------------ */

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
	struct ofi_obj *state = obj_new();
	if (!state)
		return;
	state->cq_format = attr ? (int)attr->format : FI_CQ_FORMAT_UNSPEC;
	state->cq_stride = attr ? cq_stride(attr->format) : 0;
	{
		int saved = errno;
		char buf[256];
		struct st_json j;
		st_json_begin_object(&j, buf, sizeof(buf));
		st_json_uint(&j, "id", state->id);
		st_json_int(&j, "format", state->cq_format);
		st_json_uint(&j, "size", attr ? attr->size : 0);
		st_json_close(&j, '}');
		st_ev(ST_EV_OFI_CQ_OPEN, 0, state->id, j.overflow ? 0 : st_side_json(buf, j.len));
		errno = saved;
	}
	/* Simple mode omits polling: the CQ keeps its own table, zero cost. */
	if (st_cfg.mode == ST_MODE_SIMPLE)
		return;
	PATCH_BEGIN(&cq->ops, struct fi_ops_cq, state)
#define ST_OFI_CQ_READ(slot, params, args) SET(slot, cq_##slot);
#include "ofi_ops.def"
	PATCH_END(&cq->ops);
}

static int av_insert(struct fid_av *av, const void *addr, size_t count, fi_addr_t *fi_addr, uint64_t flags, void *ctx)
{
	const struct fi_ops_av *ops = ORIG(av->ops, struct fi_ops_av);
	struct ofi_obj *state = OWNER(av->ops);
	int top = st_enter();
	int ret = ops->insert(av, addr, count, fi_addr, flags, ctx);
	st_leave();
	if (!top)
		return ret;
	int saved = errno;
	char buf[8192];
	struct st_json j;
	st_json_begin_object(&j, buf, sizeof(buf));
	st_json_uint(&j, "av", state->id);
	st_json_uint(&j, "count", count);
	st_json_int(&j, "ret", ret);
	st_json_uint(&j, "addr_format", state->addr_format);
	size_t shown = count < 64 ? count : 64;
	st_json_open(&j, "addrs", '[');
	for (size_t i = 0; addr && state->addrlen && i < shown; i++)
		st_json_sockaddr(&j, NULL, (const char *)addr + i * state->addrlen, state->addrlen);
	st_json_close(&j, ']');
	st_json_open(&j, "fi_addrs", '[');
	for (size_t i = 0; fi_addr && ret > 0 && i < shown && i < (size_t)ret; i++)
		st_json_uint(&j, NULL, fi_addr[i]);
	st_json_close(&j, ']');
	st_json_close(&j, '}');
	uint64_t sid = j.overflow ? 0 : st_side_json(buf, j.len);
	st_ev(ST_EV_OFI_AV_INSERT, (uint16_t)(ret > 0 ? (ret > 0xffff ? 0xffff : ret) : 0), state->id, sid);
	errno = saved;
	return ret;
}

static int domain_av_open(struct fid_domain *domain, struct fi_av_attr *attr, struct fid_av **av, void *ctx)
{
	const struct fi_ops_domain *ops = ORIG(domain->ops, struct fi_ops_domain);
	struct ofi_obj *domain_state = OWNER(domain->ops);
	int top = st_enter();
	int ret = ops->av_open(domain, attr, av, ctx);
	st_leave();
	if (top && ret == 0 && *av) {
		int saved = errno;
		struct ofi_obj *state = obj_new();
		if (state) {
			state->addr_format = domain_state->addr_format;
			state->addrlen = domain_state->addrlen;
			PATCH(&(*av)->ops, struct fi_ops_av, state, { SET(insert, av_insert); });
		}
		errno = saved;
	}
	return ret;
}

static void patch_domain(struct fid_domain *dom, const struct fi_info *info)
{
	struct ofi_obj *state = obj_new();
	if (!state)
		return;
	state->addr_format = info ? info->addr_format : 0;
	state->addrlen = info ? (info->src_addrlen ? info->src_addrlen : info->dest_addrlen) : 0;
	record_create(ST_EV_OFI_DOMAIN, state->id, info, NULL, 0);
	PATCH(&dom->ops, struct fi_ops_domain, state, {
		SET(av_open, domain_av_open); SET(cq_open, domain_cq_open); SET(endpoint, domain_endpoint);
	});
	PATCH_BEGIN(&dom->mr, struct fi_ops_mr, state)
#define ST_OFI_MR_REG(slot, params, args, valid, addr, len) SET(slot, mr_##slot);
#include "ofi_ops.def"
	PATCH_END(&dom->mr);
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
	int ret = real_fi_fabric(attr, fabric, context);
	st_leave();
	if (top && ret == 0 && *fabric) {
		int saved = errno;
		struct ofi_obj *state = obj_new();
		if (state) {
			/* the names are the application's: cut to 255 bytes each (marked), and
			 * a record that still does not fit (escapes grow a name up to 6x) is
			 * written without them -- never a side record that is not JSON */
			char prov[256], name[256], buf[4096];
			int cut = 0;
			if (attr && attr->prov_name) {
				cut |= strlen(attr->prov_name) >= sizeof prov;
				snprintf(prov, sizeof prov, "%s", attr->prov_name);
			}
			if (attr && attr->name) {
				cut |= strlen(attr->name) >= sizeof name;
				snprintf(name, sizeof name, "%s", attr->name);
			}
			struct st_json j;
			for (int pass = 0; pass < 2; pass++) {
				st_json_begin_object(&j, buf, sizeof(buf));
				st_json_uint(&j, "id", state->id);
				if (!pass) {
					st_json_str(&j, "provider", attr && attr->prov_name ? prov : NULL);
					st_json_str(&j, "name", attr && attr->name ? name : NULL);
				}
				st_json_hex(&j, "prov_version", attr ? attr->prov_version : 0);
				if (cut || pass)
					st_json_bool(&j, "truncated", 1);
				st_json_close(&j, '}');
				if (!j.overflow)
					break;
			}
			st_ev(ST_EV_OFI_FABRIC, 0, state->id, j.overflow ? 0 : st_side_json(buf, j.len));
			PATCH(&(*fabric)->ops, struct fi_ops_fabric, state, { SET(domain, fabric_domain); SET(domain2, fabric_domain2); });
		}
		errno = saved;
	}
	return ret;
}

static const struct st_hook ofi_hooks[] = {
	{"fi_fabric", (void *)fi_fabric, (void **)&real_fi_fabric, ST_PROV_OFI},
};

ST_HOOKS_CONSTRUCTOR(200, ofi_hooks)
