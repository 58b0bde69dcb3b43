/* sigmatrace — GPU doorbell hijack (F8) and WQE recovery (F9, F24c).
 *
 * The hijack's interface to the rest of the tracer.  First what the mlx5dv
 * provider (DevX wrappers) uses to tell the hijack which UAR pages, umems and
 * QPs exist: the provider declares these weak, so the tracer links with or
 * without the hijack.  Then the hooks of the CUDA provider (providers/cuda/).
 * Every entry point is hidden (internal to libsigmatrace.so), as the
 * providers' weak declarations say.
 * All functions are thread-safe and cheap; none calls back into the
 * application.
 */
#ifndef SIGMATRACE_HIJACK_H
#define SIGMATRACE_HIJACK_H

#include <stddef.h>
#include <stdint.h>

#include "core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A UAR was allocated (mlx5dv_devx_alloc_uar): reg_addr is the doorbell
 * register (BlueFlame/DB offset inside the page), base_addr the page start,
 * page_id the UAR index used in QP contexts, ctx the ibv_context. */
void st_hijack_note_uar(void *reg_addr, void *base_addr, uint32_t page_id, void *ctx) ST_HIDDEN;
/* The UAR is being freed: stop its poller(s) before the page goes away. */
void st_hijack_forget_uar(void *reg_addr) ST_HIDDEN;

/* CPU doorbells (F24d): right after mlx5dv_devx_alloc_uar, the address to
 * hand the application as reg_addr instead of the real register: the same
 * offset in a proxy page of ours, watched by a poller that forwards every
 * value to the real register and records it.  NULL: leave the UAR alone
 * (disabled with SIGMATRACE_CPU_DOORBELLS=0, hijack off, or any failure). */
void *st_hijack_cpu_uar(void *reg_addr, void *base_addr, uint32_t page_id, void *ctx, uint32_t flags) ST_HIDDEN;
/* Before mlx5dv_devx_free_uar: stop that poller (after a last forward) and
 * return the real reg_addr to put back; NULL if app_reg is not a proxy. */
void *st_hijack_cpu_uar_release(void *app_reg) ST_HIDDEN;

/* F24d on verbs QPs (mlx5dv_init_obj, UCX rc_mlx5 style): the address to hand
 * the application as QP qpn's BlueFlame register (bf.reg) instead of the real
 * one, in a proxy page shared by the context's QPs whose registers share the
 * real page, or NULL (the QP keeps the real register: switch off, table full,
 * the page watched by the DevX/GPU path, or too many QPs sharing the word
 * with others; a word another QP rings is shared, see cpu_doorbell.c).
 * The caller registers the QP's SQ only when it gets a proxy.  bf_size is
 * mlx5dv's bf.size (0: no BlueFlame): the poller forwards a BlueFlame copy
 * the writer made into the proxy register whole (up to bf_size bytes). */
#define ST_HIJACK_VERBS_UAR_PAGE 0xFFFFFFFFu /* page_id recorded for such pages */
void *st_hijack_cpu_verbs_reg(void *reg_addr, void *ctx, uint32_t qpn, uint32_t bf_size) ST_HIDDEN;
/* Finding 9, a QP that rdma-core rings itself (ibv_post_send, ibv_wr_complete) on a bfreg it shares
 * with a proxied QP: rdma-core writes the real register under its own per-bfreg lock, which the
 * poller cannot take, so the poller's forward could land inside that QP's 64-byte BlueFlame burst.
 * st_hijack_ring_lock: the lock of the proxied bfreg that holds real register real_reg of context
 * ctx (NULL: not proxied); the ibv provider holds it (enter/leave) around such a QP's posts and the
 * poller around its forwards to that bfreg, so the two writers of the real word take turns.
 * st_hijack_ctx_proxied: has ctx any verbs-QP proxy page (cheap; a QP made on it is looked up). */
uint32_t *st_hijack_ring_lock(void *ctx, void *real_reg) ST_HIDDEN;
int st_hijack_ctx_proxied(void *ctx) ST_HIDDEN;
void st_hijack_ring_enter(uint32_t *lock) ST_HIDDEN;
void st_hijack_ring_leave(uint32_t *lock) ST_HIDDEN;
/* ibv_close_device: stop the pollers of this context's verbs-QP proxy pages
 * (the real UAR pages go away with the context). */
void st_hijack_cpu_release_ctx(void *ctx) ST_HIDDEN;
/* ibv_destroy_qp: forget the QP and its SQ/DBR umems registered as a verbs QP. */
void st_hijack_forget_verbs_qp(uint32_t qpn, uint32_t sq_umem_id, uint32_t dbr_umem_id) ST_HIDDEN;

/* A umem was registered (mlx5dv_devx_umem_reg); gpu != 0 if addr is device memory. */
void st_hijack_note_umem(uint32_t umem_id, void *addr, uint64_t size, int gpu) ST_HIDDEN;
void st_hijack_forget_umem(uint32_t umem_id) ST_HIDDEN;

/* A QP was created through DevX (CREATE_QP): its SQ lives in umem wq_umem_id at
 * sq_offset, 2^log_sq_size WQEBBs of 64 bytes; its doorbell record in
 * dbr_umem_id at dbr_offset; it rings UAR page uar_page. */
void st_hijack_note_qp(uint32_t qpn, uint32_t uar_page, uint32_t wq_umem_id, uint64_t sq_offset,
                       uint32_t log_sq_size, uint32_t dbr_umem_id, uint64_t dbr_offset) ST_HIDDEN;
void st_hijack_forget_qp(uint32_t qpn) ST_HIDDEN;

/* ---- hooks of the CUDA provider ------------------------------------------ */
/* A host range was registered with the driver (after the real call succeeded). */
void st_hijack_on_register(void *p, size_t size, unsigned flags) ST_HIDDEN;
/* The application unregisters a range: pollers of doorbells inside it stop
 * (forwarding what they hold) before the real unregister. */
void st_hijack_on_unregister(void *p) ST_HIDDEN;
/* The application asks for the device pointer of host pointer p; the driver
 * gave real_dptr.  Returns the pointer to hand out (a proxy page's device
 * pointer when p is a doorbell register), *hijacked set accordingly. */
uint64_t st_hijack_devptr(void *p, uint64_t real_dptr, int *hijacked) ST_HIDDEN;
/* Pointer-attribute consistency: if d lies in a proxy page handed out by the
 * hijack, return the real device pointer it stands for (else d). */
uint64_t st_hijack_real_of_proxy(uint64_t d) ST_HIDDEN;
/* ... and the other way round (a real doorbell device pointer -> proxy). */
uint64_t st_hijack_proxy_of_real(uint64_t d) ST_HIDDEN;
/* CPU-doorbell proxies (F24d): an address inside a proxy page handed out as
 * a UAR's reg_addr stands, for the driver, for the same offset of the real
 * UAR page; anything else is returned unchanged.  Lock-free, cheap when no
 * proxy exists. */
void *st_hijack_cpu_real(void *p) ST_HIDDEN;
/* ... and the other way round (real UAR page -> proxy) for host pointers the
 * driver reports. */
uint64_t st_hijack_cpu_proxy_of_real(uint64_t host) ST_HIDDEN;
/* Stop every poller (process exit). */
void st_hijack_shutdown(void) ST_HIDDEN;

#ifdef __cplusplus
}
#endif
#endif
