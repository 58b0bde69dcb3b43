/*
 * The UCX (UCP) ABI pieces the tracer uses, declared here so that it builds without UCX's
 * development headers (issue 17, F27).  Layouts and values are those of UCX 1.13's public headers
 * <ucp/api/ucp.h>, <ucp/api/ucp_def.h>, <ucp/api/ucp_compat.h>, <ucs/type/status.h> and
 * <ucs/config/types.h> (Debian 12's libucx-dev 1.13.1); nothing here is UCX's code.
 * tests/test_abi_conformance.py checks them against the real headers wherever they are installed.
 *
 * Declared: the handles (opaque), status codes, the datatype encoding, the parameter structs the
 * tracer reads (request parameters, endpoint parameters) and the prototypes of the functions the
 * UCX provider wraps or calls.
 */
#ifndef ST_ABI_UCP_H
#define ST_ABI_UCP_H

/* the public header this file follows (build_info.json) */
#define ST_ABI_UCP_FROM "UCX 1.13 ucp/api/ucp.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* ---- ucs: status codes.  A packed enum (one byte) in UCX, so returned and passed as one. ---- */
typedef enum __attribute__((packed)) {
	UCS_OK = 0,
	UCS_INPROGRESS = 1,
	UCS_ERR_LAST = -100,
} ucs_status_t;

/* A request pointer, or an error status cast to a pointer (the last 100 addresses). */
typedef void *ucs_status_ptr_t;
#define UCS_PTR_IS_ERR(_ptr) (((uintptr_t)(_ptr)) >= ((uintptr_t)UCS_ERR_LAST))
#define UCS_PTR_IS_PTR(_ptr) (((uintptr_t)(_ptr)-1) < ((uintptr_t)UCS_ERR_LAST - 1))

typedef enum ucs_memory_type {
	UCS_MEMORY_TYPE_HOST,
} ucs_memory_type_t;

typedef struct ucs_sock_addr {
	const struct sockaddr *addr;
	socklen_t addrlen;
} ucs_sock_addr_t;

/* ---- handles ---- */
typedef struct ucp_context *ucp_context_h;
typedef struct ucp_worker *ucp_worker_h;
typedef struct ucp_ep *ucp_ep_h;
typedef struct ucp_rkey *ucp_rkey_h;
typedef struct ucp_mem *ucp_mem_h;
typedef struct ucp_conn_request *ucp_conn_request_h;
typedef struct ucp_recv_desc *ucp_tag_message_h;
typedef struct ucp_address ucp_address_t;
typedef struct ucp_tag_recv_info ucp_tag_recv_info_t;
typedef struct ucp_worker_params ucp_worker_params_t;
typedef struct ucp_conn_request_attr ucp_conn_request_attr_t;
typedef uint64_t ucp_tag_t;

/* ---- datatypes: the class in the low bits, a contiguous element's size above them ---- */
typedef uint64_t ucp_datatype_t;
enum ucp_dt_type {
	UCP_DATATYPE_CONTIG = 0,
	UCP_DATATYPE_IOV = 2,
	UCP_DATATYPE_SHIFT = 3,
	UCP_DATATYPE_CLASS_MASK = 7,
};

typedef struct ucp_dt_iov {
	void *buffer;
	size_t length;
} ucp_dt_iov_t;

typedef enum {
	UCP_ATOMIC_OP_ADD,
} ucp_atomic_op_t;

/* ---- callbacks ---- */
typedef void (*ucp_send_callback_t)(void *request, ucs_status_t status);
typedef void (*ucp_tag_recv_callback_t)(void *request, ucs_status_t status, ucp_tag_recv_info_t *info);
typedef void (*ucp_stream_recv_callback_t)(void *request, ucs_status_t status, size_t length);
typedef void (*ucp_send_nbx_callback_t)(void *request, ucs_status_t status, void *user_data);
typedef void (*ucp_tag_recv_nbx_callback_t)(void *request, ucs_status_t status, const ucp_tag_recv_info_t *tag_info,
					    void *user_data);
typedef void (*ucp_stream_recv_nbx_callback_t)(void *request, ucs_status_t status, size_t length, void *user_data);
typedef void (*ucp_am_recv_data_nbx_callback_t)(void *request, ucs_status_t status, size_t length, void *user_data);
typedef void (*ucp_err_handler_cb_t)(void *arg, ucp_ep_h ep, ucs_status_t status);

/* ---- the parameters of an operation (the *_nbx calls) ---- */
typedef enum {
	UCP_OP_ATTR_FIELD_DATATYPE = 1 << 3,
} ucp_op_attr_t;

typedef struct {
	uint32_t op_attr_mask;
	uint32_t flags;
	void *request;
	union {
		ucp_send_nbx_callback_t send;
		ucp_tag_recv_nbx_callback_t recv;
		ucp_stream_recv_nbx_callback_t recv_stream;
		ucp_am_recv_data_nbx_callback_t recv_am;
	} cb;
	ucp_datatype_t datatype;
	void *user_data;
	void *reply_buffer;
	ucs_memory_type_t memory_type;
	union {
		size_t *length;
		ucp_tag_recv_info_t *tag_info;
	} recv_info;
	ucp_mem_h memh;
} ucp_request_param_t;

/* ---- the parameters of ucp_ep_create ---- */
enum ucp_ep_params_field {
	UCP_EP_PARAM_FIELD_REMOTE_ADDRESS = 1 << 0,
	UCP_EP_PARAM_FIELD_SOCK_ADDR = 1 << 4,
	UCP_EP_PARAM_FIELD_CONN_REQUEST = 1 << 6,
};

typedef struct ucp_err_handler {
	ucp_err_handler_cb_t cb;
	void *arg;
} ucp_err_handler_t;

typedef struct ucp_ep_params {
	uint64_t field_mask;
	const ucp_address_t *address;
	int err_mode; /* ucp_err_handling_mode_t */
	ucp_err_handler_t err_handler;
	void *user_data;
	unsigned flags;
	ucs_sock_addr_t sockaddr;
	ucp_conn_request_h conn_request;
	const char *name;
	ucs_sock_addr_t local_sockaddr;
} ucp_ep_params_t;

/* ---- the exported functions the UCX provider wraps (providers/ucx/ucx_shims.def) or calls ---- */
ucs_status_ptr_t ucp_put_nbx(ucp_ep_h ep, const void *buffer, size_t count, uint64_t remote_addr, ucp_rkey_h rkey,
			     const ucp_request_param_t *param);
ucs_status_ptr_t ucp_get_nbx(ucp_ep_h ep, void *buffer, size_t count, uint64_t remote_addr, ucp_rkey_h rkey,
			     const ucp_request_param_t *param);
ucs_status_ptr_t ucp_atomic_op_nbx(ucp_ep_h ep, ucp_atomic_op_t opcode, const void *buffer, size_t count,
				   uint64_t remote_addr, ucp_rkey_h rkey, const ucp_request_param_t *param);
ucs_status_ptr_t ucp_tag_send_nbx(ucp_ep_h ep, const void *buffer, size_t count, ucp_tag_t tag,
				  const ucp_request_param_t *param);
ucs_status_ptr_t ucp_tag_send_nb(ucp_ep_h ep, const void *buffer, size_t count, ucp_datatype_t datatype,
				 ucp_tag_t tag, ucp_send_callback_t cb);
ucs_status_t ucp_tag_send_nbr(ucp_ep_h ep, const void *buffer, size_t count, ucp_datatype_t datatype, ucp_tag_t tag,
			      void *req);
ucs_status_ptr_t ucp_tag_send_sync_nbx(ucp_ep_h ep, const void *buffer, size_t count, ucp_tag_t tag,
				       const ucp_request_param_t *param);
ucs_status_ptr_t ucp_tag_recv_nbx(ucp_worker_h worker, void *buffer, size_t count, ucp_tag_t tag, ucp_tag_t tag_mask,
				  const ucp_request_param_t *param);
ucs_status_ptr_t ucp_tag_recv_nb(ucp_worker_h worker, void *buffer, size_t count, ucp_datatype_t datatype,
				 ucp_tag_t tag, ucp_tag_t tag_mask, ucp_tag_recv_callback_t cb);
ucs_status_t ucp_tag_recv_nbr(ucp_worker_h worker, void *buffer, size_t count, ucp_datatype_t datatype, ucp_tag_t tag,
			      ucp_tag_t tag_mask, void *req);
ucs_status_ptr_t ucp_tag_msg_recv_nbx(ucp_worker_h worker, void *buffer, size_t count, ucp_tag_message_h message,
				      const ucp_request_param_t *param);
ucs_status_ptr_t ucp_stream_send_nbx(ucp_ep_h ep, const void *buffer, size_t count, const ucp_request_param_t *param);
ucs_status_ptr_t ucp_stream_send_nb(ucp_ep_h ep, const void *buffer, size_t count, ucp_datatype_t datatype,
				    ucp_send_callback_t cb, unsigned flags);
ucs_status_ptr_t ucp_stream_recv_nbx(ucp_ep_h ep, void *buffer, size_t count, size_t *length,
				     const ucp_request_param_t *param);
ucs_status_ptr_t ucp_stream_recv_nb(ucp_ep_h ep, void *buffer, size_t count, ucp_datatype_t datatype,
				    ucp_stream_recv_callback_t cb, size_t *length, unsigned flags);
ucs_status_ptr_t ucp_am_send_nbx(ucp_ep_h ep, unsigned id, const void *header, size_t header_length,
				 const void *buffer, size_t count, const ucp_request_param_t *param);
ucs_status_ptr_t ucp_am_send_nb(ucp_ep_h ep, uint16_t id, const void *buffer, size_t count, ucp_datatype_t datatype,
				ucp_send_callback_t cb, unsigned flags);
ucs_status_ptr_t ucp_am_recv_data_nbx(ucp_worker_h worker, void *data_desc, void *buffer, size_t count,
				      const ucp_request_param_t *param);
ucs_status_ptr_t ucp_put_nb(ucp_ep_h ep, const void *buffer, size_t length, uint64_t remote_addr, ucp_rkey_h rkey,
			    ucp_send_callback_t cb);
ucs_status_ptr_t ucp_get_nb(ucp_ep_h ep, void *buffer, size_t length, uint64_t remote_addr, ucp_rkey_h rkey,
			    ucp_send_callback_t cb);
ucs_status_t ucp_put_nbi(ucp_ep_h ep, const void *buffer, size_t length, uint64_t remote_addr, ucp_rkey_h rkey);
ucs_status_t ucp_get_nbi(ucp_ep_h ep, void *buffer, size_t length, uint64_t remote_addr, ucp_rkey_h rkey);
ucs_status_t ucp_ep_create(ucp_worker_h worker, const ucp_ep_params_t *params, ucp_ep_h *ep_p);
ucs_status_t ucp_worker_create(ucp_context_h context, const ucp_worker_params_t *params, ucp_worker_h *worker_p);
unsigned ucp_worker_progress(ucp_worker_h worker);
ucs_status_t ucp_request_check_status(void *request);
ucs_status_t ucp_request_test(void *request, ucp_tag_recv_info_t *info);
ucs_status_t ucp_tag_recv_request_test(void *request, ucp_tag_recv_info_t *info);
ucs_status_t ucp_stream_recv_request_test(void *request, size_t *length_p);
ucs_status_ptr_t ucp_ep_close_nbx(ucp_ep_h ep, const ucp_request_param_t *param);
ucs_status_ptr_t ucp_ep_close_nb(ucp_ep_h ep, unsigned mode);
void ucp_ep_destroy(ucp_ep_h ep);
void ucp_worker_destroy(ucp_worker_h worker);
ucs_status_ptr_t ucp_ep_flush_nbx(ucp_ep_h ep, const ucp_request_param_t *param);
ucs_status_ptr_t ucp_worker_flush_nbx(ucp_worker_h worker, const ucp_request_param_t *param);
ucs_status_t ucp_worker_get_address(ucp_worker_h worker, ucp_address_t **address_p, size_t *address_length_p);
void ucp_worker_release_address(ucp_worker_h worker, ucp_address_t *address);
ucs_status_t ucp_conn_request_query(ucp_conn_request_h conn_request, ucp_conn_request_attr_t *attr);

#endif /* ST_ABI_UCP_H */
