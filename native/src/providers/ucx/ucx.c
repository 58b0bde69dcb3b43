/*
 * UCX (UCP) provider (F10).
 *
 * UCP communication calls are real exported functions of libucp, so symbol
 * shims (plus dlsym injection through the shared hook table) see them all;
 * no tables to patch.  The shims are listed in ucx_shims.def (X-macros):
 * those of one shape (forward, time, call, record) are generated from it,
 * the rest are written out at the end of this file.  We never link libucp: helpers it offers
 * (ucp_worker_get_address) are resolved at run time from the program's copy.
 *
 * Ids: endpoints and workers get small ids (core/objmap.c) at creation;
 * UCP_EP_CREATE / UCP_WORKER_CREATE carry a side JSON with the identity
 * (peer socket address, or the first bytes of the peer's worker address,
 * which the peer's UCP_WORKER_CREATE records as its own address prefix).
 *
 * Recording rules (docs/tracer.md): a call is recorded when UCX accepted it
 * (not an error status).  The EXT record carries the tag / remote address
 * and the request pointer; in full mode an operation that completed in place
 * gets a UCP_REQUEST_DONE at once, and the request-test functions record
 * UCP_REQUEST_DONE when they first report completion.  ucp_worker_progress
 * is recorded in full mode only (counted in aggregate mode); a run of empty
 * ones as its first and last call (st_idle_poll).
 */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "abi/ucp.h"

#include "interpose/interpose.h"

enum { V_NBX = 0, V_NB = 1, V_NBR = 2, V_NBI = 3, V_SYNC_NBX = 4, V_MSG_NBX = 5 };

/* recording: the provider is on and this is the application's call, not UCX calling itself */
#define ON() likely(st_provider_on(ST_PROV_UCX) && !st_tls_depth)

static size_t dt_bytes(ucp_datatype_t dt, const void *buffer, size_t count)
{
	switch (dt & UCP_DATATYPE_CLASS_MASK) {
	case UCP_DATATYPE_CONTIG:
		return count * (size_t)(dt >> UCP_DATATYPE_SHIFT);
	case UCP_DATATYPE_IOV: {
		const ucp_dt_iov_t *iov = buffer;
		size_t b = 0;
		for (size_t i = 0; iov && i < count; i++)
			b += iov[i].length;
		return b;
	}
	default:
		return count; /* generic datatypes: elements, size unknown here */
	}
}

static inline size_t param_bytes(const ucp_request_param_t *p, const void *buffer, size_t count)
{
	if (p && (p->op_attr_mask & UCP_OP_ATTR_FIELD_DATATYPE))
		return dt_bytes(p->datatype, buffer, count);
	return count;
}

/* One accepted operation.  status: the returned status pointer (NULL = done). */
static inline void ucx_op(uint64_t t0, uint16_t type, uint16_t aux, const void *owner, uint64_t bytes, uint64_t x0,
			  const void *status)
{
	if (UCS_PTR_IS_ERR(status))
		return;
	int saved = errno;
	uint32_t id = st_obj_id(owner, NULL);
	uint64_t req = UCS_PTR_IS_PTR(status) ? (uintptr_t)status : 0;
	if (st_aggregate()) {
		st_agg_add(type, aux, id, 0, bytes);
	} else {
		struct st_event *e = st_reserve(2);
		if (e) {
			e[0] = (struct st_event){t0, type, aux, id, bytes};
			e[1] = (struct st_event){x0, ST_EV_EXT, 0, 0, req};
			st_commit();
		}
		if (!req && st_full())
			st_ev(ST_EV_UCP_REQUEST_DONE, UCS_OK, id, 0);
	}
	errno = saved;
}

static inline void ucx_status_op(uint64_t t0, uint16_t type, uint16_t aux, const void *owner, uint64_t bytes,
				 uint64_t x0, ucs_status_t s)
{
	/* nbr/nbi variants return a status: UCS_OK = done, INPROGRESS = pending */
	if (s == UCS_OK || s == UCS_INPROGRESS)
		ucx_op(t0, type, aux, owner, bytes, x0, s == UCS_OK ? NULL : (const void *)1);
}

/* real_<name> for every row of ucx_shims.def */
#define ST_UCX_SHIM(ret_type, name, params, args, record) static __typeof__(name) *real_##name;
#define ST_UCX_SHIM_BY_HAND(name) static __typeof__(name) *real_##name;
#include "ucx_shims.def"

#define R(name) ST_REAL(real_##name, #name)

/* ---- what the shims record (the `record` column of ucx_shims.def) ------------------ */

static inline void request_done(void *request, ucs_status_t s)
{
	if (s == UCS_INPROGRESS || !st_full())
		return;
	int saved = errno;
	st_ev(ST_EV_UCP_REQUEST_DONE, (uint16_t)(int16_t)s, 0, (uintptr_t)request);
	errno = saved;
}

static inline void am_data_received(ucs_status_ptr_t ret, ucp_worker_h worker, const ucp_request_param_t *param,
				    void *buffer, size_t count)
{
	if (UCS_PTR_IS_ERR(ret))
		return;
	int saved = errno;
	uint32_t worker_id = st_obj_id(worker, NULL);
	size_t bytes = param_bytes(param, buffer, count);
	if (st_aggregate())
		st_agg_add(ST_EV_UCP_AM_RECV, 0, worker_id, 0, bytes);
	else
		st_ev(ST_EV_UCP_AM_RECV, 0, worker_id, bytes);
	errno = saved;
}

/* UCP_FLUSH (scope 0: endpoint, 1: worker) with the request, not counted in
 * aggregate mode. */
static inline void flush_started(uint64_t t0, uint16_t scope, const void *owner, ucs_status_ptr_t ret)
{
	if (UCS_PTR_IS_ERR(ret) || st_aggregate())
		return;
	int saved = errno;
	struct st_event *e = st_reserve(1);
	if (e) {
		*e = (struct st_event){t0, ST_EV_UCP_FLUSH, scope, st_obj_id(owner, NULL), UCS_PTR_IS_PTR(ret) ? (uintptr_t)ret : 0};
		st_commit();
	}
	errno = saved;
}

/* A created worker or endpoint: a fresh id, and its side JSON begun with it. */
static uint32_t created_begin(const void *obj, struct st_json *j, char *buf, size_t cap)
{
	int is_new = 0;
	uint32_t id = st_obj_id(obj, &is_new);
	st_json_begin_object(j, buf, cap);
	st_json_uint(j, "id", id);
	return id;
}

/* ... and its event, carrying the JSON. */
static void created_end(uint16_t type, uint32_t id, struct st_json *j)
{
	st_json_close(j, '}');
	st_ev(type, 0, id, j->overflow ? 0 : st_side_json(j->buf, j->len));
}

/* UCP_WORKER_CREATE: the id, and the first bytes of the worker's address,
 * which a peer's UCP_EP_CREATE records as remote_address_prefix. */
static void worker_created(ucs_status_t ret, ucp_worker_h *worker_p)
{
	if (ret != UCS_OK || !worker_p || !*worker_p)
		return;
	int saved = errno;
	char buf[1024];
	struct st_json j;
	uint32_t id = created_begin(*worker_p, &j, buf, sizeof(buf));
	/* the worker's own address: peers record its first bytes at ep creation */
	static ucs_status_t (*get_addr)(ucp_worker_h, ucp_address_t **, size_t *);
	static void (*rel_addr)(ucp_worker_h, ucp_address_t *);
	ST_REAL(get_addr, "ucp_worker_get_address");
	ST_REAL(rel_addr, "ucp_worker_release_address");
	ucp_address_t *addr = NULL;
	size_t alen = 0;
	st_enter();
	int got = get_addr && rel_addr && get_addr(*worker_p, &addr, &alen) == UCS_OK;
	st_leave();
	if (got) {
		st_json_uint(&j, "address_len", alen);
		st_json_bytes_hex(&j, "address_prefix", addr, alen < 24 ? alen : 24);
		st_enter();
		rel_addr(*worker_p, addr);
		st_leave();
	}
	created_end(ST_EV_UCP_WORKER_CREATE, id, &j);
	errno = saved;
}

/* Up to n bytes of the memory at p into out, never more than is mapped there
 * (a UCX worker address has no length in ucp_ep_params_t: the peer's address
 * may end before 24 bytes, at the end of a mapping).  The kernel copies
 * (process_vm_readv on ourselves): a page that is not readable ends the copy
 * instead of faulting.  Two pieces, the first up to the end of p's page, so
 * an unreadable next page still leaves the first.  Bytes copied. */
static size_t read_mapped(void *out, const void *p, size_t n)
{
	uintptr_t a = (uintptr_t)p;
	size_t first = 4096 - (a & 4095);
	if (first > n)
		first = n;
	struct iovec local[2] = {{out, first}, {(char *)out + first, n - first}};
	struct iovec remote[2] = {{(void *)p, first}, {(void *)(a + first), n - first}};
	ssize_t got = process_vm_readv(getpid(), local, n > first ? 2 : 1, remote, n > first ? 2 : 1, 0);
	if (got < 0 && errno != EFAULT) {
		/* the call refused (a seccomp filter, say): the rest of p's page is
		 * mapped if its first byte is */
		memcpy(out, p, first);
		return first;
	}
	return got > 0 ? (size_t)got : 0;
}

/* UCP_EP_CREATE: the id and how the endpoint names its peer. */
static void ep_created(ucs_status_t ret, ucp_worker_h worker, const ucp_ep_params_t *params, ucp_ep_h *ep_p)
{
	if (ret != UCS_OK || !ep_p || !*ep_p)
		return;
	int saved = errno;
	char buf[1024];
	struct st_json j;
	uint32_t id = created_begin(*ep_p, &j, buf, sizeof(buf));
	st_json_uint(&j, "worker", st_obj_id(worker, NULL));
	if (params) {
		st_json_hex(&j, "field_mask", params->field_mask);
		if ((params->field_mask & UCP_EP_PARAM_FIELD_REMOTE_ADDRESS) && params->address) {
			/* the first bytes, as the peer's UCP_WORKER_CREATE records min(length, 24) of its own */
			unsigned char pre[24];
			size_t n = read_mapped(pre, params->address, sizeof pre);
			st_json_bytes_hex(&j, "remote_address_prefix", pre, n);
		}
		if ((params->field_mask & UCP_EP_PARAM_FIELD_SOCK_ADDR) && params->sockaddr.addr)
			st_json_sockaddr(&j, "sockaddr", params->sockaddr.addr, params->sockaddr.addrlen);
		if (params->field_mask & UCP_EP_PARAM_FIELD_CONN_REQUEST) {
			static ucs_status_t (*query)(ucp_conn_request_h, ucp_conn_request_attr_t *);
			ST_REAL(query, "ucp_conn_request_query");
			(void)query; /* the request is consumed by ucp_ep_create: nothing to query now */
			st_json_bool(&j, "accepted", 1);
		}
	}
	created_end(ST_EV_UCP_EP_CREATE, id, &j);
	errno = saved;
}

/* ---- the generated shims (rows ST_UCX_SHIM) ------------------------------------------ */
#define ST_UCX_SHIM(ret_type, name, params, args, record)                            \
	ST_EXPORT ret_type name params                                               \
	{                                                                            \
		__typeof__(real_##name) real = R(name);                              \
		if (!ON())                                                           \
			return real args;                                            \
		uint64_t t0 __attribute__((unused)) = st_aggregate() ? 0 : st_tsc(); \
		st_enter();                                                          \
		ret_type ret = real args;                                            \
		st_leave();                                                          \
		record;                                                              \
		return ret;                                                          \
	}
#define ST_UCX_SHIM_BY_HAND(name)
#include "ucx_shims.def"

/* ---- the shims written out (rows ST_UCX_SHIM_BY_HAND) --------------------------------- */

/* progress: full mode records, aggregate mode counts, simple mode forwards */
ST_EXPORT unsigned ucp_worker_progress(ucp_worker_h worker)
{
	__typeof__(real_ucp_worker_progress) real = R(ucp_worker_progress);
	if (likely(st_cfg.mode == ST_MODE_SIMPLE) || !ON())
		return real(worker);
	uint64_t t0 = st_aggregate() ? 0 : st_tsc();
	st_enter();
	unsigned done = real(worker);
	st_leave();
	int saved = errno;
	uint32_t worker_id = st_obj_id(worker, NULL);
	if (st_aggregate()) {
		st_agg_add(ST_EV_UCP_WORKER_PROGRESS, 0, worker_id, 0, done);
	} else if (!done) {
		st_idle_poll(t0, ST_EV_UCP_WORKER_PROGRESS, worker_id, 0);
	} else {
		struct st_event *e = st_reserve(1);
		if (e) {
			*e = (struct st_event){t0, ST_EV_UCP_WORKER_PROGRESS, (uint16_t)(done > 0xffff ? 0xffff : done), worker_id, 0};
			st_commit();
		}
	}
	errno = saved;
	return done;
}

/* UCP_EP_CLOSE (aux 0: a close request, 1: ucp_ep_destroy), recorded before
 * the endpoint goes. */
static inline void ep_closing(ucp_ep_h ep, uint16_t how)
{
	if (ON()) {
		int saved = errno;
		st_ev(ST_EV_UCP_EP_CLOSE, how, st_obj_id(ep, NULL), 0);
		errno = saved;
	}
}

/* After a close or destroy the object's id entry goes (core/objmap.c): UCX
 * may hand the address out again for another endpoint or worker.  Always,
 * traced or not (the entry was made while tracing); errno kept.  A close that
 * UCX refused (an error status) leaves the endpoint, and its id, alive. */
static void forget(const void *obj, ucs_status_ptr_t how_it_went)
{
	int saved = errno;
	if (!UCS_PTR_IS_ERR(how_it_went))
		st_obj_forget(obj);
	errno = saved;
}

ST_EXPORT ucs_status_ptr_t ucp_ep_close_nbx(ucp_ep_h ep, const ucp_request_param_t *param)
{
	ep_closing(ep, 0);
	__typeof__(real_ucp_ep_close_nbx) real = R(ucp_ep_close_nbx);
	ucs_status_ptr_t r = real(ep, param);
	forget(ep, r);
	return r;
}

ST_EXPORT ucs_status_ptr_t ucp_ep_close_nb(ucp_ep_h ep, unsigned mode)
{
	ep_closing(ep, 0);
	__typeof__(real_ucp_ep_close_nb) real = R(ucp_ep_close_nb);
	ucs_status_ptr_t r = real(ep, mode);
	forget(ep, r);
	return r;
}

ST_EXPORT void ucp_ep_destroy(ucp_ep_h ep)
{
	ep_closing(ep, 1);
	__typeof__(real_ucp_ep_destroy) real = R(ucp_ep_destroy);
	real(ep);
	forget(ep, NULL);
}

ST_EXPORT void ucp_worker_destroy(ucp_worker_h worker)
{
	__typeof__(real_ucp_worker_destroy) real = R(ucp_worker_destroy);
	real(worker);
	forget(worker, NULL);
}

/* ---- hook table (dlsym injection) ------------------------------------------------------ */

static const struct st_hook ucx_hooks[] = {
#define ST_UCX_SHIM(ret_type, name, params, args, record) {#name, (void *)name, (void **)&real_##name, ST_PROV_UCX},
#define ST_UCX_SHIM_BY_HAND(name) {#name, (void *)name, (void **)&real_##name, ST_PROV_UCX},
#include "ucx_shims.def"
};

ST_HOOKS_CONSTRUCTOR(200, ucx_hooks)
