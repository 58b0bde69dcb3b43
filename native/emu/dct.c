/* libibverbs.so.1 of the emulated HCA: DC targets (DCTs).
 *
 * A DCT is the responder end of Dynamically Connected transport: any DCI
 * (DC initiator, a DevX CREATE_QP with st = DCI, emu_mlx5dv.c) that names
 * its number, the node's LID and the DCT's access key in a WQE's address
 * vector reaches it.  It has no send queue; its receives come from an SRQ,
 * their completions go to its CQ.  In the NIC it is a QP of type
 * EMU_QPT_DCT in the QP number space (real DCT numbers share it), so the
 * responder serves DC requests exactly as RC ones (responder.c), after the
 * access key check (fabric requests from a DCI carry the key).
 *
 * Two ways to make one, both only where SIGMATRACE_EMU_DC=1 (the HCA then
 * reports hca_cap.dct = 1):
 *   - mlx5dv_create_qp(IBV_QPT_DRIVER, MLX5DV_DCTYPE_DCT, dct_access_key)
 *     then ibv_modify_qp RESET->INIT (STATE|PKEY_INDEX|PORT|ACCESS_FLAGS) and
 *     INIT->RTR (STATE|AV|PATH_MTU|MIN_RNR_TIMER): what NVSHMEM 3.4.5 does
 *     (ibgda.cpp ibgda_create_dct) and UCX 1.13 probes DC support with;
 *   - DevX CREATE_DCT (0x710), active at once (emu_mlx5dv.c).
 * Without SIGMATRACE_EMU_DC the HCA has no DC (UCX then offers no dc_mlx5,
 * whose verbs DCIs the emulator does not create). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "emu_internal.h"
#include "emu_prm.h"

struct emu_srq *emu_srq_lookup(uint32_t srqn);

/* A DCT on srq and rcq (both required), key its access key. */
EXPORT struct emu_qp *emu_dct_new(struct emu_nic *nic, struct ibv_context *c, struct emu_srq *srq, struct emu_cq *rcq,
				  uint64_t key, uint32_t pdn, int devx)
{
	struct emu_qp *qp = emu_zalloc(sizeof *qp);
	if (!qp)
		return NULL;
	qp->qp_type = EMU_QPT_DCT;
	qp->devx = devx;
	qp->srq = srq;
	qp->rcq = rcq;
	qp->scq = NULL;
	qp->dc_key = key;
	qp->pdn = pdn;
	qp->state = IBV_QPS_RESET;
	qp->atomic_mode = EMU_QPC_ATOMIC_MODE_UP_TO_8B;
	pthread_mutex_lock(&nic->lock);
	int r = emu_qp_register(nic, qp);
	pthread_mutex_unlock(&nic->lock);
	if (r) {
		free(qp);
		errno = ENOMEM;
		return NULL;
	}
	struct ibv_qp *b = &qp->qpx.qp_base;
	b->context = c;
	b->qp_num = qp->qpn;
	b->handle = qp->qpn;
	b->qp_type = IBV_QPT_DRIVER;
	b->state = IBV_QPS_RESET;
	b->srq = &srq->srq;
	b->recv_cq = &rcq->cq;
	pthread_mutex_init(&b->mutex, NULL);
	pthread_cond_init(&b->cond, NULL);
	return qp;
}

/* mlx5dv_create_qp(DCT) for libmlx5.so.1: the ibv_qp_init_attr_ex has been
 * checked for the DC type there. */
EXPORT struct ibv_qp *emu_dct_create(struct ibv_context *c, struct ibv_qp_init_attr_ex *a, uint64_t access_key)
{
	if (!(a->comp_mask & IBV_QP_INIT_ATTR_PD) || !a->pd || !a->srq || !a->recv_cq) {
		errno = EINVAL; /* rdma-core: a DCT needs a PD, an SRQ and a receive CQ */
		return NULL;
	}
	struct emu_nic *nic = to_ectx(c)->nic;
	struct emu_qp *qp = emu_dct_new(nic, c, (struct emu_srq *)a->srq, to_ecq(a->recv_cq), access_key,
					emu_pd_num(a->pd), 0);
	if (!qp)
		return NULL;
	struct ibv_qp *b = &qp->qpx.qp_base;
	b->pd = a->pd;
	b->qp_context = a->qp_context;
	b->send_cq = a->send_cq;
	EMU_LOG("create DCT 0x%x (srq %u, cq 0x%x, key 0x%llx)", qp->qpn, ((struct emu_srq *)a->srq)->srqn,
		qp->rcq->cqn, (unsigned long long)access_key);
	return b;
}

/* ibv_modify_qp on a DCT: RESET->INIT, INIT->RTR (where it starts taking
 * requests), ->RESET, ->ERR; the attribute masks rdma-core's mlx5 provider
 * requires for a DCT. */
EXPORT int emu_dct_modify(struct emu_qp *qp, struct ibv_qp_attr *attr, int mask)
{
	struct emu_nic *nic = qp->nic;
	if (!(mask & IBV_QP_STATE))
		return EINVAL;
	pthread_mutex_lock(&nic->lock);
	int cur = qp->state, nw = (int)attr->qp_state, need = -1;
	if (cur == IBV_QPS_RESET && nw == IBV_QPS_INIT)
		need = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
	else if (cur == IBV_QPS_INIT && nw == IBV_QPS_RTR)
		need = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_MIN_RNR_TIMER;
	else if (nw == IBV_QPS_RESET || nw == IBV_QPS_ERR)
		need = 0;
	if (need < 0 || (mask & need) != need || ((mask & IBV_QP_PORT) && attr->port_num != 1)) {
		EMU_LOG("modify DCT 0x%x %s->%s rejected (mask 0x%x)", qp->qpn, emu_state_name(cur), emu_state_name(nw), mask);
		pthread_mutex_unlock(&nic->lock);
		return EINVAL;
	}
	if (mask & IBV_QP_ACCESS_FLAGS)
		qp->qp_access = attr->qp_access_flags;
	if (mask & IBV_QP_PORT)
		qp->port = attr->port_num;
	if (mask & IBV_QP_PKEY_INDEX)
		qp->pkey_index = attr->pkey_index;
	if (mask & IBV_QP_PATH_MTU)
		qp->mtu = (uint8_t)attr->path_mtu;
	if (mask & IBV_QP_MIN_RNR_TIMER)
		qp->min_rnr_timer = attr->min_rnr_timer;
	if (nw == IBV_QPS_RESET)
		emu_qp_reset_nic_state(qp);
	else if (nw == IBV_QPS_ERR)
		emu_qp_to_error(qp);
	qp->state = nw;
	qp->qpx.qp_base.state = (enum ibv_qp_state)nw;
	EMU_LOG("DCT 0x%x -> %s", qp->qpn, emu_state_name(nw));
	pthread_mutex_unlock(&nic->lock);
	emu_nic_kick(nic);
	return 0;
}
