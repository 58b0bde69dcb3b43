/* libibverbs.so.1 of the emulated HCA: helpers, strings, and the entry points
 * that exist only so that binaries and libraries linked with BIND_NOW against
 * rdma-core (perftest, librdmacm, libefa) load.  Unsupported calls fail with
 * EOPNOTSUPP. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "emu_internal.h"

EXPORT const char *ibv_wc_status_str(enum ibv_wc_status s)
{
	static const char *const t[] = {
		[IBV_WC_SUCCESS] = "success",
		[IBV_WC_LOC_LEN_ERR] = "local length error",
		[IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
		[IBV_WC_LOC_EEC_OP_ERR] = "local EE context operation error",
		[IBV_WC_LOC_PROT_ERR] = "local protection error",
		[IBV_WC_WR_FLUSH_ERR] = "Work Request Flushed Error",
		[IBV_WC_MW_BIND_ERR] = "memory management operation error",
		[IBV_WC_BAD_RESP_ERR] = "bad response error",
		[IBV_WC_LOC_ACCESS_ERR] = "local access error",
		[IBV_WC_REM_INV_REQ_ERR] = "remote invalid request error",
		[IBV_WC_REM_ACCESS_ERR] = "remote access error",
		[IBV_WC_REM_OP_ERR] = "remote operation error",
		[IBV_WC_RETRY_EXC_ERR] = "transport retry counter exceeded",
		[IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retry counter exceeded",
		[IBV_WC_LOC_RDD_VIOL_ERR] = "local RDD violation error",
		[IBV_WC_REM_INV_RD_REQ_ERR] = "remote invalid RD request",
		[IBV_WC_REM_ABORT_ERR] = "aborted error",
		[IBV_WC_INV_EECN_ERR] = "invalid EE context number",
		[IBV_WC_INV_EEC_STATE_ERR] = "invalid EE context state",
		[IBV_WC_FATAL_ERR] = "fatal error",
		[IBV_WC_RESP_TIMEOUT_ERR] = "response timeout error",
		[IBV_WC_GENERAL_ERR] = "general error",
		[IBV_WC_TM_ERR] = "TM error",
		[IBV_WC_TM_RNDV_INCOMPLETE] = "TM software rendezvous",
	};
	return (unsigned)s < sizeof t / sizeof t[0] && t[s] ? t[s] : "unknown";
}

EXPORT const char *ibv_node_type_str(enum ibv_node_type t)
{
	switch (t) {
	case IBV_NODE_CA: return "InfiniBand channel adapter";
	case IBV_NODE_SWITCH: return "InfiniBand switch";
	case IBV_NODE_ROUTER: return "InfiniBand router";
	case IBV_NODE_RNIC: return "iWARP NIC";
	default: return "unknown";
	}
}

EXPORT const char *ibv_port_state_str(enum ibv_port_state s)
{
	switch (s) {
	case IBV_PORT_NOP: return "PORT_NOP";
	case IBV_PORT_DOWN: return "PORT_DOWN";
	case IBV_PORT_INIT: return "PORT_INIT";
	case IBV_PORT_ARMED: return "PORT_ARMED";
	case IBV_PORT_ACTIVE: return "PORT_ACTIVE";
	case IBV_PORT_ACTIVE_DEFER: return "PORT_ACTIVE_DEFER";
	default: return "invalid state";
	}
}

EXPORT const char *ibv_event_type_str(enum ibv_event_type e)
{
	static char buf[32];
	snprintf(buf, sizeof buf, "event %d", (int)e);
	return buf;
}

/* One row per rate: the four conversions below look a value up in one column
 * and return the other. */
enum { RATE, MULT, MBPS };
static const int rates[][3] = {
	{ IBV_RATE_2_5_GBPS, 1, 2500 },  { IBV_RATE_5_GBPS, 2, 5000 },   { IBV_RATE_10_GBPS, 4, 10000 },
	{ IBV_RATE_20_GBPS, 8, 20000 },  { IBV_RATE_30_GBPS, 12, 30000 }, { IBV_RATE_40_GBPS, 16, 40000 },
	{ IBV_RATE_60_GBPS, 24, 60000 }, { IBV_RATE_80_GBPS, 32, 80000 }, { IBV_RATE_120_GBPS, 48, 120000 },
	{ IBV_RATE_100_GBPS, 40, 100000 }, { IBV_RATE_200_GBPS, 80, 200000 }, { IBV_RATE_400_GBPS, 160, 400000 },
};
static int rate_convert(int from, int value, int to, int unknown)
{
	for (size_t i = 0; i < sizeof rates / sizeof rates[0]; i++)
		if (rates[i][from] == value)
			return rates[i][to];
	return unknown;
}
EXPORT int ibv_rate_to_mult(enum ibv_rate r) { return rate_convert(RATE, (int)r, MULT, -1); }
EXPORT enum ibv_rate mult_to_ibv_rate(int m) { return (enum ibv_rate)rate_convert(MULT, m, RATE, IBV_RATE_MAX); }
EXPORT int ibv_rate_to_mbps(enum ibv_rate r) { return rate_convert(RATE, (int)r, MBPS, -1); }
EXPORT enum ibv_rate mbps_to_ibv_rate(int m) { return (enum ibv_rate)rate_convert(MBPS, m, RATE, IBV_RATE_MAX); }

EXPORT int ibv_fork_init(void) { return 0; }
EXPORT enum ibv_fork_status ibv_is_fork_initialized(void) { return IBV_FORK_DISABLED; }
EXPORT int ibv_dontfork_range(void *b, size_t s) { return 0; }
EXPORT int ibv_dofork_range(void *b, size_t s) { return 0; }

EXPORT const char *ibv_get_sysfs_path(void) { return "/sys"; }
EXPORT int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size) { return -1; }
EXPORT int ibv_read_ibdev_sysfs_file(char *buf, size_t size, void *sysfs_dev, const char *fnfmt, ...) { return -1; }

/* multicast: not emulated (AHs: ah.c) */
EXPORT int ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid) { return EOPNOTSUPP; }
EXPORT int ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid) { return EOPNOTSUPP; }
EXPORT int ibv_resolve_eth_l2_from_gid(struct ibv_context *c, struct ibv_ah_attr *a, uint8_t eth_mac[6], uint16_t *vid)
{ return EOPNOTSUPP; }
EXPORT int ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece) { return EOPNOTSUPP; }
EXPORT int ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece) { return EOPNOTSUPP; }
EXPORT struct ibv_context *ibv_import_device(int fd) { errno = EOPNOTSUPP; return NULL; }
EXPORT struct ibv_pd *ibv_import_pd(struct ibv_context *c, uint32_t h) { errno = EOPNOTSUPP; return NULL; }
EXPORT void ibv_unimport_pd(struct ibv_pd *pd) {}
EXPORT struct ibv_mr *ibv_import_mr(struct ibv_pd *pd, uint32_t h) { errno = EOPNOTSUPP; return NULL; }
EXPORT void ibv_unimport_mr(struct ibv_mr *mr) {}
EXPORT struct ibv_dm *ibv_import_dm(struct ibv_context *c, uint32_t h) { errno = EOPNOTSUPP; return NULL; }
EXPORT void ibv_unimport_dm(struct ibv_dm *dm) {}

/* kernel-ABI copy helpers (librdmacm imports them; the emulator has no kernel ABI) */
EXPORT void ibv_copy_qp_attr_from_kern(void *dst, void *src) {}
EXPORT void ibv_copy_ah_attr_from_kern(void *dst, void *src) {}
EXPORT void ibv_copy_path_rec_from_kern(void *dst, void *src) {}
EXPORT void ibv_copy_path_rec_to_kern(void *dst, void *src) {}

/* IBVERBS_PRIVATE_34: the provider interface of rdma-core.  Providers are not
 * loaded by the emulator; these exist so that provider libraries linked with
 * BIND_NOW (e.g. libefa.so.1 pulled in by perftest) can be loaded. */
EXPORT void verbs_register_driver_34(const void *ops) {}
EXPORT void __verbs_log(void *ctx, int level, const char *fmt, ...) {}
#define ST_PRIV_STUB(name) EXPORT int name(void) { return EOPNOTSUPP; }
ST_PRIV_STUB(__ioctl_final_num_attrs)
ST_PRIV_STUB(_verbs_init_and_alloc_context)
ST_PRIV_STUB(execute_ioctl)
ST_PRIV_STUB(ibv_cmd_advise_mr)
ST_PRIV_STUB(ibv_cmd_alloc_dm)
ST_PRIV_STUB(ibv_cmd_alloc_mw)
ST_PRIV_STUB(ibv_cmd_alloc_pd)
ST_PRIV_STUB(ibv_cmd_attach_mcast)
ST_PRIV_STUB(ibv_cmd_close_xrcd)
ST_PRIV_STUB(ibv_cmd_create_ah)
ST_PRIV_STUB(ibv_cmd_create_counters)
ST_PRIV_STUB(ibv_cmd_create_cq)
ST_PRIV_STUB(ibv_cmd_create_cq_ex)
ST_PRIV_STUB(ibv_cmd_create_flow)
ST_PRIV_STUB(ibv_cmd_create_flow_action_esp)
ST_PRIV_STUB(ibv_cmd_create_qp)
ST_PRIV_STUB(ibv_cmd_create_qp_ex)
ST_PRIV_STUB(ibv_cmd_create_qp_ex2)
ST_PRIV_STUB(ibv_cmd_create_rwq_ind_table)
ST_PRIV_STUB(ibv_cmd_create_srq)
ST_PRIV_STUB(ibv_cmd_create_srq_ex)
ST_PRIV_STUB(ibv_cmd_create_wq)
ST_PRIV_STUB(ibv_cmd_dealloc_mw)
ST_PRIV_STUB(ibv_cmd_dealloc_pd)
ST_PRIV_STUB(ibv_cmd_dereg_mr)
ST_PRIV_STUB(ibv_cmd_destroy_ah)
ST_PRIV_STUB(ibv_cmd_destroy_counters)
ST_PRIV_STUB(ibv_cmd_destroy_cq)
ST_PRIV_STUB(ibv_cmd_destroy_flow)
ST_PRIV_STUB(ibv_cmd_destroy_flow_action)
ST_PRIV_STUB(ibv_cmd_destroy_qp)
ST_PRIV_STUB(ibv_cmd_destroy_rwq_ind_table)
ST_PRIV_STUB(ibv_cmd_destroy_srq)
ST_PRIV_STUB(ibv_cmd_destroy_wq)
ST_PRIV_STUB(ibv_cmd_detach_mcast)
ST_PRIV_STUB(ibv_cmd_free_dm)
ST_PRIV_STUB(ibv_cmd_get_context)
ST_PRIV_STUB(ibv_cmd_modify_cq)
ST_PRIV_STUB(ibv_cmd_modify_flow_action_esp)
ST_PRIV_STUB(ibv_cmd_modify_qp)
ST_PRIV_STUB(ibv_cmd_modify_qp_ex)
ST_PRIV_STUB(ibv_cmd_modify_srq)
ST_PRIV_STUB(ibv_cmd_modify_wq)
ST_PRIV_STUB(ibv_cmd_open_qp)
ST_PRIV_STUB(ibv_cmd_open_xrcd)
ST_PRIV_STUB(ibv_cmd_poll_cq)
ST_PRIV_STUB(ibv_cmd_post_recv)
ST_PRIV_STUB(ibv_cmd_post_send)
ST_PRIV_STUB(ibv_cmd_post_srq_recv)
ST_PRIV_STUB(ibv_cmd_query_context)
ST_PRIV_STUB(ibv_cmd_query_device_any)
ST_PRIV_STUB(ibv_cmd_query_mr)
ST_PRIV_STUB(ibv_cmd_query_port)
ST_PRIV_STUB(ibv_cmd_query_qp)
ST_PRIV_STUB(ibv_cmd_query_srq)
ST_PRIV_STUB(ibv_cmd_read_counters)
ST_PRIV_STUB(ibv_cmd_reg_dm_mr)
ST_PRIV_STUB(ibv_cmd_reg_dmabuf_mr)
ST_PRIV_STUB(ibv_cmd_reg_mr)
ST_PRIV_STUB(ibv_cmd_req_notify_cq)
ST_PRIV_STUB(ibv_cmd_rereg_mr)
ST_PRIV_STUB(ibv_cmd_resize_cq)
ST_PRIV_STUB(verbs_allow_disassociate_destroy)
ST_PRIV_STUB(verbs_init_cq)
ST_PRIV_STUB(verbs_open_device)
ST_PRIV_STUB(verbs_set_ops)
ST_PRIV_STUB(verbs_uninit_context)
