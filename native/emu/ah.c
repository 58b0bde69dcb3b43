/* libibverbs.so.1 of the emulated HCA: address handles.  An AH holds the
 * mlx5 address vector (ref §1.8) that UD WQEs carry in their datagram
 * segment, filled as rdma-core's mlx5_create_ah fills it for an IB port:
 * rlid, SL and rate, and for a global route the GRH bit, sgid index, flow
 * label, traffic class, hop limit and rgid.  mlx5dv_init_obj(AH) hands out
 * a pointer to it (UCX ud_mlx5 copies it into its WQEs). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "emu_internal.h"

/* ibv_ah_attr.static_rate -> the AV's 4-bit rate (rdma-core's ah_attr_to_mlx5_rate) */
static uint8_t mlx5_rate(uint8_t r)
{
	return r ? (uint8_t)((r + 5) & 0xf) : 0;
}

EXPORT struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *a)
{
	if (!pd || !a || a->port_num != 1) {
		errno = EINVAL;
		return NULL;
	}
	struct emu_ah *ah = emu_zalloc(sizeof *ah);
	if (!ah)
		return NULL;
	ah->av.fl_mlid = a->src_path_bits & 0x7f;
	ah->av.rlid = htobe16(a->dlid);
	ah->av.stat_rate_sl = (uint8_t)((mlx5_rate(a->static_rate) << 4) | (a->sl & 0xf));
	if (a->is_global) {
		ah->av.tclass = a->grh.traffic_class;
		ah->av.hop_limit = a->grh.hop_limit;
		ah->av.grh_gid_fl = htobe32((1u << 30) | ((uint32_t)(a->grh.sgid_index & 0xff) << 20) |
					    (a->grh.flow_label & 0xfffff));
		memcpy(ah->av.rgid, a->grh.dgid.raw, 16);
	}
	ah->is_global = a->is_global;
	ah->ah.context = pd->context;
	ah->ah.pd = pd;
	ah->ah.handle = 0;
	EMU_LOG("create ah dlid %u%s", a->dlid, a->is_global ? " (global)" : "");
	return &ah->ah;
}

EXPORT int ibv_destroy_ah(struct ibv_ah *ah)
{
	free(ah);
	return 0;
}

/* The AH that answers the sender of a received UD completion (IB spec
 * 11.2.5: the SLID, and with a GRH the source GID as destination). */
EXPORT int ibv_init_ah_from_wc(struct ibv_context *c, uint8_t port, struct ibv_wc *wc, struct ibv_grh *grh,
			       struct ibv_ah_attr *a)
{
	memset(a, 0, sizeof *a);
	a->dlid = wc->slid;
	a->sl = wc->sl;
	a->src_path_bits = wc->dlid_path_bits;
	a->port_num = port;
	if (wc->wc_flags & IBV_WC_GRH) {
		if (!grh) {
			errno = EINVAL;
			return -1;
		}
		uint32_t flow = be32toh(grh->version_tclass_flow);
		a->is_global = 1;
		memcpy(a->grh.dgid.raw, grh->sgid.raw, 16);
		a->grh.sgid_index = 0;
		a->grh.hop_limit = 0xff;
		a->grh.traffic_class = (uint8_t)((flow >> 20) & 0xff);
		a->grh.flow_label = flow & 0xfffff;
	}
	return 0;
}

EXPORT struct ibv_ah *ibv_create_ah_from_wc(struct ibv_pd *pd, struct ibv_wc *wc, struct ibv_grh *grh, uint8_t port)
{
	struct ibv_ah_attr a;
	if (ibv_init_ah_from_wc(pd->context, port, wc, grh, &a))
		return NULL;
	return ibv_create_ah(pd, &a);
}
