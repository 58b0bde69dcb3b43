/*
 * UCX (UCP) provider (F10).
 *
 * UCP communication calls are real exported functions of libucp, so symbol
 * shims (plus dlsym injection through the shared hook table) see them all;
 * no tables to patch.  We never link libucp: helpers it offers
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
 * is recorded in full mode only (counted in aggregate mode).
 */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include <ucp/api/ucp.h>

#include "interpose/interpose.h"

enum { V_NBX = 0, V_NB = 1, V_NBR = 2, V_NBI = 3, V_SYNC_NBX = 4, V_MSG_NBX = 5 };

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

/* One accepted operation.  st: the returned status pointer (NULL = done). */
static inline void ucx_op(uint64_t t0, uint16_t type, uint16_t aux, const void *owner, uint64_t bytes, uint64_t x0,
			  const void *st)
{
	if (UCS_PTR_IS_ERR(st))
		return;
	int saved = errno;
	uint32_t id = st_obj_id(owner, NULL);
	uint64_t req = UCS_PTR_IS_PTR(st) ? (uintptr_t)st : 0;
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

#define REAL(name) static __typeof__(name) *real_##name
REAL(ucp_put_nbx); REAL(ucp_get_nbx); REAL(ucp_atomic_op_nbx); REAL(ucp_tag_send_nbx); REAL(ucp_tag_send_nb);
REAL(ucp_tag_send_nbr); REAL(ucp_tag_send_sync_nbx); REAL(ucp_tag_recv_nbx); REAL(ucp_tag_recv_nb);
REAL(ucp_tag_recv_nbr); REAL(ucp_tag_msg_recv_nbx); REAL(ucp_stream_send_nbx); REAL(ucp_stream_send_nb);
REAL(ucp_stream_recv_nbx); REAL(ucp_stream_recv_nb); REAL(ucp_am_send_nbx); REAL(ucp_am_send_nb);
REAL(ucp_am_recv_data_nbx); REAL(ucp_put_nb); REAL(ucp_get_nb); REAL(ucp_put_nbi); REAL(ucp_get_nbi);
REAL(ucp_ep_create); REAL(ucp_worker_create); REAL(ucp_worker_progress); REAL(ucp_request_check_status);
REAL(ucp_request_test); REAL(ucp_tag_recv_request_test); REAL(ucp_stream_recv_request_test);
REAL(ucp_ep_close_nbx); REAL(ucp_ep_close_nb); REAL(ucp_ep_destroy); REAL(ucp_ep_flush_nbx);
REAL(ucp_worker_flush_nbx);
#undef REAL

#define R(name) ST_REAL(real_##name, #name)

/* Forward when off; otherwise time, call under the guard, and record. */
#define CALL(name, ...)                                   \
	__typeof__(real_##name) f_ = R(name);             \
	if (!ON())                                        \
		return f_(__VA_ARGS__);                   \
	uint64_t t0 __attribute__((unused)) = st_aggregate() ? 0 : st_tsc(); \
	st_enter();                                       \
	__typeof__(f_(__VA_ARGS__)) r = f_(__VA_ARGS__);  \
	st_leave();

/* ---- RMA and atomics ------------------------------------------------------------- */

ST_EXPORT ucs_status_ptr_t ucp_put_nbx(ucp_ep_h ep, const void *buffer, size_t count, uint64_t raddr, ucp_rkey_h rkey,
				       const ucp_request_param_t *param)
{
	CALL(ucp_put_nbx, ep, buffer, count, raddr, rkey, param)
	ucx_op(t0, ST_EV_UCP_PUT, V_NBX, ep, param_bytes(param, buffer, count), raddr, r);
	return r;
}

ST_EXPORT ucs_status_ptr_t ucp_get_nbx(ucp_ep_h ep, void *buffer, size_t count, uint64_t raddr, ucp_rkey_h rkey,
				       const ucp_request_param_t *param)
{
	CALL(ucp_get_nbx, ep, buffer, count, raddr, rkey, param)
	ucx_op(t0, ST_EV_UCP_GET, V_NBX, ep, param_bytes(param, buffer, count), raddr, r);
	return r;
}

ST_EXPORT ucs_status_ptr_t ucp_atomic_op_nbx(ucp_ep_h ep, ucp_atomic_op_t opcode, const void *buffer, size_t count,
					     uint64_t raddr, ucp_rkey_h rkey, const ucp_request_param_t *param)
{
	CALL(ucp_atomic_op_nbx, ep, opcode, buffer, count, raddr, rkey, param)
	ucx_op(t0, ST_EV_UCP_ATOMIC, (uint16_t)opcode, ep, param_bytes(param, buffer, count), raddr, r);
	return r;
}

ST_EXPORT ucs_status_ptr_t ucp_put_nb(ucp_ep_h ep, const void *buffer, size_t length, uint64_t raddr, ucp_rkey_h rkey,
				      ucp_send_callback_t cb)
{
	CALL(ucp_put_nb, ep, buffer, length, raddr, rkey, cb)
	ucx_op(t0, ST_EV_UCP_PUT, V_NB, ep, length, raddr, r);
	return r;
}

ST_EXPORT ucs_status_ptr_t ucp_get_nb(ucp_ep_h ep, void *buffer, size_t length, uint64_t raddr, ucp_rkey_h rkey,
				      ucp_send_callback_t cb)
{
	CALL(ucp_get_nb, ep, buffer, length, raddr, rkey, cb)
	ucx_op(t0, ST_EV_UCP_GET, V_NB, ep, length, raddr, r);
	return r;
}

ST_EXPORT ucs_status_t ucp_put_nbi(ucp_ep_h ep, const void *buffer, size_t length, uint64_t raddr, ucp_rkey_h rkey)
{
	CALL(ucp_put_nbi, ep, buffer, length, raddr, rkey)
	ucx_status_op(t0, ST_EV_UCP_PUT, V_NBI, ep, length, raddr, r);
	return r;
}

ST_EXPORT ucs_status_t ucp_get_nbi(ucp_ep_h ep, void *buffer, size_t length, uint64_t raddr, ucp_rkey_h rkey)
{
	CALL(ucp_get_nbi, ep, buffer, length, raddr, rkey)
	ucx_status_op(t0, ST_EV_UCP_GET, V_NBI, ep, length, raddr, r);
	return r;
}

/* ---- tag matching ------------------------------------------------------------------ */

ST_EXPORT ucs_status_ptr_t ucp_tag_send_nbx(ucp_ep_h ep, const void *buffer, size_t count, ucp_tag_t tag,
					    const ucp_request_param_t *param)
{
	CALL(ucp_tag_send_nbx, ep, buffer, count, tag, param)
	ucx_op(t0, ST_EV_UCP_TAG_SEND, V_NBX, ep, param_bytes(param, buffer, count), tag, r);
	return r;
}

ST_EXPORT ucs_status_ptr_t ucp_tag_send_sync_nbx(ucp_ep_h ep, const void *buffer, size_t count, ucp_tag_t tag,
						 const ucp_request_param_t *param)
{
	CALL(ucp_tag_send_sync_nbx, ep, buffer, count, tag, param)
	ucx_op(t0, ST_EV_UCP_TAG_SEND, V_SYNC_NBX, ep, param_bytes(param, buffer, count), tag, r);
	return r;
}

ST_EXPORT ucs_status_ptr_t ucp_tag_send_nb(ucp_ep_h ep, const void *buffer, size_t count, ucp_datatype_t datatype,
					   ucp_tag_t tag, ucp_send_callback_t cb)
{
	CALL(ucp_tag_send_nb, ep, buffer, count, datatype, tag, cb)
	ucx_op(t0, ST_EV_UCP_TAG_SEND, V_NB, ep, dt_bytes(datatype, buffer, count), tag, r);
	return r;
}

ST_EXPORT ucs_status_t ucp_tag_send_nbr(ucp_ep_h ep, const void *buffer, size_t count, ucp_datatype_t datatype,
					ucp_tag_t tag, void *req)
{
	CALL(ucp_tag_send_nbr, ep, buffer, count, datatype, tag, req)
	ucx_status_op(t0, ST_EV_UCP_TAG_SEND, V_NBR, ep, dt_bytes(datatype, buffer, count), tag, r);
	return r;
}

ST_EXPORT ucs_status_ptr_t ucp_tag_recv_nbx(ucp_worker_h worker, void *buffer, size_t count, ucp_tag_t tag,
					    ucp_tag_t tag_mask, const ucp_request_param_t *param)
{
	CALL(ucp_tag_recv_nbx, worker, buffer, count, tag, tag_mask, param)
	ucx_op(t0, ST_EV_UCP_TAG_RECV, V_NBX, worker, param_bytes(param, buffer, count), tag, r);
	return r;
}

ST_EXPORT ucs_status_ptr_t ucp_tag_recv_nb(ucp_worker_h worker, void *buffer, size_t count, ucp_datatype_t datatype,
					   ucp_tag_t tag, ucp_tag_t tag_mask, ucp_tag_recv_callback_t cb)
{
	CALL(ucp_tag_recv_nb, worker, buffer, count, datatype, tag, tag_mask, cb)
	ucx_op(t0, ST_EV_UCP_TAG_RECV, V_NB, worker, dt_bytes(datatype, buffer, count), tag, r);
	return r;
}

ST_EXPORT ucs_status_t ucp_tag_recv_nbr(ucp_worker_h worker, void *buffer, size_t count, ucp_datatype_t datatype,
					ucp_tag_t tag, ucp_tag_t tag_mask, void *req)
{
	CALL(ucp_tag_recv_nbr, worker, buffer, count, datatype, tag, tag_mask, req)
	ucx_status_op(t0, ST_EV_UCP_TAG_RECV, V_NBR, worker, dt_bytes(datatype, buffer, count), tag, r);
	return r;
}

ST_EXPORT ucs_status_ptr_t ucp_tag_msg_recv_nbx(ucp_worker_h worker, void *buffer, size_t count,
						ucp_tag_message_h message, const ucp_request_param_t *param)
{
	CALL(ucp_tag_msg_recv_nbx, worker, buffer, count, message, param)
	ucx_op(t0, ST_EV_UCP_TAG_RECV, V_MSG_NBX, worker, param_bytes(param, buffer, count), 0, r);
	return r;
}

/* ---- streams ------------------------------------------------------------------------ */

ST_EXPORT ucs_status_ptr_t ucp_stream_send_nbx(ucp_ep_h ep, const void *buffer, size_t count,
					       const ucp_request_param_t *param)
{
	CALL(ucp_stream_send_nbx, ep, buffer, count, param)
	ucx_op(t0, ST_EV_UCP_STREAM_SEND, V_NBX, ep, param_bytes(param, buffer, count), 0, r);
	return r;
}

ST_EXPORT ucs_status_ptr_t ucp_stream_send_nb(ucp_ep_h ep, const void *buffer, size_t count, ucp_datatype_t datatype,
					      ucp_send_callback_t cb, unsigned flags)
{
	CALL(ucp_stream_send_nb, ep, buffer, count, datatype, cb, flags)
	ucx_op(t0, ST_EV_UCP_STREAM_SEND, V_NB, ep, dt_bytes(datatype, buffer, count), 0, r);
	return r;
}

ST_EXPORT ucs_status_ptr_t ucp_stream_recv_nbx(ucp_ep_h ep, void *buffer, size_t count, size_t *length,
					       const ucp_request_param_t *param)
{
	CALL(ucp_stream_recv_nbx, ep, buffer, count, length, param)
	/* completed in place: *length is what arrived */
	size_t b = (r == NULL && length) ? *length : param_bytes(param, buffer, count);
	ucx_op(t0, ST_EV_UCP_STREAM_RECV, V_NBX, ep, b, 0, r);
	return r;
}

ST_EXPORT ucs_status_ptr_t ucp_stream_recv_nb(ucp_ep_h ep, void *buffer, size_t count, ucp_datatype_t datatype,
					      ucp_stream_recv_callback_t cb, size_t *length, unsigned flags)
{
	CALL(ucp_stream_recv_nb, ep, buffer, count, datatype, cb, length, flags)
	size_t b = (r == NULL && length) ? *length : dt_bytes(datatype, buffer, count);
	ucx_op(t0, ST_EV_UCP_STREAM_RECV, V_NB, ep, b, 0, r);
	return r;
}

/* ---- active messages ------------------------------------------------------------------ */

ST_EXPORT ucs_status_ptr_t ucp_am_send_nbx(ucp_ep_h ep, unsigned id, const void *header, size_t header_length,
					   const void *buffer, size_t count, const ucp_request_param_t *param)
{
	CALL(ucp_am_send_nbx, ep, id, header, header_length, buffer, count, param)
	ucx_op(t0, ST_EV_UCP_AM_SEND, (uint16_t)id, ep, param_bytes(param, buffer, count), header_length, r);
	return r;
}

ST_EXPORT ucs_status_ptr_t ucp_am_send_nb(ucp_ep_h ep, uint16_t id, const void *buffer, size_t count,
					  ucp_datatype_t datatype, ucp_send_callback_t cb, unsigned flags)
{
	CALL(ucp_am_send_nb, ep, id, buffer, count, datatype, cb, flags)
	ucx_op(t0, ST_EV_UCP_AM_SEND, id, ep, dt_bytes(datatype, buffer, count), 0, r);
	return r;
}

ST_EXPORT ucs_status_ptr_t ucp_am_recv_data_nbx(ucp_worker_h worker, void *data_desc, void *buffer, size_t count,
						const ucp_request_param_t *param)
{
	CALL(ucp_am_recv_data_nbx, worker, data_desc, buffer, count, param)
	if (!UCS_PTR_IS_ERR(r)) {
		int saved = errno;
		uint32_t wid = st_obj_id(worker, NULL);
		size_t b = param_bytes(param, buffer, count);
		if (st_aggregate())
			st_agg_add(ST_EV_UCP_AM_RECV, 0, wid, 0, b);
		else
			st_ev(ST_EV_UCP_AM_RECV, 0, wid, b);
		errno = saved;
	}
	return r;
}

/* ---- completion ----------------------------------------------------------------------------- */

static inline void request_done(void *request, ucs_status_t s)
{
	if (s == UCS_INPROGRESS || !st_full())
		return;
	int saved = errno;
	st_ev(ST_EV_UCP_REQUEST_DONE, (uint16_t)(int16_t)s, 0, (uintptr_t)request);
	errno = saved;
}

ST_EXPORT ucs_status_t ucp_request_check_status(void *request)
{
	CALL(ucp_request_check_status, request)
	(void)t0;
	request_done(request, r);
	return r;
}

ST_EXPORT ucs_status_t ucp_request_test(void *request, ucp_tag_recv_info_t *info)
{
	CALL(ucp_request_test, request, info)
	(void)t0;
	request_done(request, r);
	return r;
}

ST_EXPORT ucs_status_t ucp_tag_recv_request_test(void *request, ucp_tag_recv_info_t *info)
{
	CALL(ucp_tag_recv_request_test, request, info)
	(void)t0;
	request_done(request, r);
	return r;
}

ST_EXPORT ucs_status_t ucp_stream_recv_request_test(void *request, size_t *length_p)
{
	CALL(ucp_stream_recv_request_test, request, length_p)
	(void)t0;
	request_done(request, r);
	return r;
}

/* ---- progress (full mode; counted in aggregate mode) ------------------------------------------ */

ST_EXPORT unsigned ucp_worker_progress(ucp_worker_h worker)
{
	__typeof__(real_ucp_worker_progress) f = R(ucp_worker_progress);
	if (likely(st_cfg.mode == ST_MODE_SIMPLE) || !ON())
		return f(worker);
	uint64_t t0 = st_aggregate() ? 0 : st_tsc();
	st_enter();
	unsigned r = f(worker);
	st_leave();
	int saved = errno;
	uint32_t wid = st_obj_id(worker, NULL);
	if (st_aggregate()) {
		st_agg_add(ST_EV_UCP_WORKER_PROGRESS, 0, wid, 0, r);
	} else {
		struct st_event *e = st_reserve(1);
		if (e) {
			*e = (struct st_event){t0, ST_EV_UCP_WORKER_PROGRESS, (uint16_t)(r > 0xffff ? 0xffff : r), wid, 0};
			st_commit();
		}
	}
	errno = saved;
	return r;
}

/* ---- lifecycle: workers, endpoints ------------------------------------------------------------- */

ST_EXPORT ucs_status_t ucp_worker_create(ucp_context_h context, const ucp_worker_params_t *params,
					 ucp_worker_h *worker_p)
{
	CALL(ucp_worker_create, context, params, worker_p)
	(void)t0;
	if (r == UCS_OK && worker_p && *worker_p) {
		int saved = errno;
		int is_new = 0;
		uint32_t id = st_obj_id(*worker_p, &is_new);
		char buf[1024];
		struct st_json j;
		st_json_init(&j, buf, sizeof(buf));
		st_json_open(&j, NULL, '{');
		st_json_uint(&j, "id", id);
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
		st_json_close(&j, '}');
		st_ev(ST_EV_UCP_WORKER_CREATE, 0, id, j.overflow ? 0 : st_side_json(buf, j.len));
		errno = saved;
	}
	return r;
}

ST_EXPORT ucs_status_t ucp_ep_create(ucp_worker_h worker, const ucp_ep_params_t *params, ucp_ep_h *ep_p)
{
	CALL(ucp_ep_create, worker, params, ep_p)
	(void)t0;
	if (r == UCS_OK && ep_p && *ep_p) {
		int saved = errno;
		int is_new = 0;
		uint32_t id = st_obj_id(*ep_p, &is_new);
		char buf[1024];
		struct st_json j;
		st_json_init(&j, buf, sizeof(buf));
		st_json_open(&j, NULL, '{');
		st_json_uint(&j, "id", id);
		st_json_uint(&j, "worker", st_obj_id(worker, NULL));
		if (params) {
			st_json_hex(&j, "field_mask", params->field_mask);
			if ((params->field_mask & UCP_EP_PARAM_FIELD_REMOTE_ADDRESS) && params->address)
				st_json_bytes_hex(&j, "remote_address_prefix", params->address, 24);
			if ((params->field_mask & UCP_EP_PARAM_FIELD_SOCK_ADDR) && params->sockaddr.addr)
				st_json_sockaddr(&j, "sockaddr", params->sockaddr.addr, params->sockaddr.addrlen);
			if (params->field_mask & UCP_EP_PARAM_FIELD_CONN_REQUEST) {
				static ucs_status_t (*query)(ucp_conn_request_h, ucp_conn_request_attr_t *);
				ST_REAL(query, "ucp_conn_request_query");
				(void)query; /* the request is consumed by ucp_ep_create: nothing to query now */
				st_json_bool(&j, "accepted", 1);
			}
		}
		st_json_close(&j, '}');
		st_ev(ST_EV_UCP_EP_CREATE, 0, id, j.overflow ? 0 : st_side_json(buf, j.len));
		errno = saved;
	}
	return r;
}

ST_EXPORT ucs_status_ptr_t ucp_ep_close_nbx(ucp_ep_h ep, const ucp_request_param_t *param)
{
	if (ON()) {
		int saved = errno;
		st_ev(ST_EV_UCP_EP_CLOSE, 0, st_obj_id(ep, NULL), 0);
		errno = saved;
	}
	__typeof__(real_ucp_ep_close_nbx) f = R(ucp_ep_close_nbx);
	return f(ep, param);
}

ST_EXPORT ucs_status_ptr_t ucp_ep_close_nb(ucp_ep_h ep, unsigned mode)
{
	if (ON()) {
		int saved = errno;
		st_ev(ST_EV_UCP_EP_CLOSE, 0, st_obj_id(ep, NULL), 0);
		errno = saved;
	}
	__typeof__(real_ucp_ep_close_nb) f = R(ucp_ep_close_nb);
	return f(ep, mode);
}

ST_EXPORT void ucp_ep_destroy(ucp_ep_h ep)
{
	if (ON()) {
		int saved = errno;
		st_ev(ST_EV_UCP_EP_CLOSE, 1, st_obj_id(ep, NULL), 0);
		errno = saved;
	}
	__typeof__(real_ucp_ep_destroy) f = R(ucp_ep_destroy);
	f(ep);
}

ST_EXPORT ucs_status_ptr_t ucp_ep_flush_nbx(ucp_ep_h ep, const ucp_request_param_t *param)
{
	CALL(ucp_ep_flush_nbx, ep, param)
	if (!UCS_PTR_IS_ERR(r) && !st_aggregate()) {
		int saved = errno;
		struct st_event *e = st_reserve(1);
		if (e) {
			*e = (struct st_event){t0, ST_EV_UCP_FLUSH, 0, st_obj_id(ep, NULL), UCS_PTR_IS_PTR(r) ? (uintptr_t)r : 0};
			st_commit();
		}
		errno = saved;
	}
	return r;
}

ST_EXPORT ucs_status_ptr_t ucp_worker_flush_nbx(ucp_worker_h worker, const ucp_request_param_t *param)
{
	CALL(ucp_worker_flush_nbx, worker, param)
	if (!UCS_PTR_IS_ERR(r) && !st_aggregate()) {
		int saved = errno;
		struct st_event *e = st_reserve(1);
		if (e) {
			*e = (struct st_event){t0, ST_EV_UCP_FLUSH, 1, st_obj_id(worker, NULL),
					       UCS_PTR_IS_PTR(r) ? (uintptr_t)r : 0};
			st_commit();
		}
		errno = saved;
	}
	return r;
}

/* ---- hook table (dlsym injection) ------------------------------------------------------------------ */

#define H(name) {#name, (void *)name, (void **)&real_##name, ST_PROV_UCX}
static const struct st_hook ucx_hooks[] = {
	H(ucp_put_nbx), H(ucp_get_nbx), H(ucp_atomic_op_nbx), H(ucp_tag_send_nbx), H(ucp_tag_send_nb),
	H(ucp_tag_send_nbr), H(ucp_tag_send_sync_nbx), H(ucp_tag_recv_nbx), H(ucp_tag_recv_nb), H(ucp_tag_recv_nbr),
	H(ucp_tag_msg_recv_nbx), H(ucp_stream_send_nbx), H(ucp_stream_send_nb), H(ucp_stream_recv_nbx),
	H(ucp_stream_recv_nb), H(ucp_am_send_nbx), H(ucp_am_send_nb), H(ucp_am_recv_data_nbx), H(ucp_put_nb),
	H(ucp_get_nb), H(ucp_put_nbi), H(ucp_get_nbi), H(ucp_ep_create), H(ucp_worker_create),
	H(ucp_worker_progress), H(ucp_request_check_status), H(ucp_request_test), H(ucp_tag_recv_request_test),
	H(ucp_stream_recv_request_test), H(ucp_ep_close_nbx), H(ucp_ep_close_nb), H(ucp_ep_destroy),
	H(ucp_ep_flush_nbx), H(ucp_worker_flush_nbx),
};
#undef H

__attribute__((constructor(200))) static void ucx_init(void)
{
	st_hooks_register(ucx_hooks, sizeof(ucx_hooks) / sizeof(ucx_hooks[0]));
}
