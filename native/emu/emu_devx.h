/* What the two source files of libmlx5.so.1 share (emu_mlx5dv.c: mlx5dv
 * for verbs objects, UARs, umems; devx_prm.c: the DevX PRM commands): the
 * handles they hand out and the libibverbs.so.1 helpers they call. */
#ifndef ST_EMU_DEVX_H
#define ST_EMU_DEVX_H

#include <infiniband/mlx5dv.h>
#include <string.h>

#include "emu_internal.h"
#include "emu_prm.h"

/* from libibverbs.so.1 (private) */
struct emu_nic *emu_ctx_nic(struct ibv_context *c);
uint32_t emu_pd_num(struct ibv_pd *pd);
struct emu_cq *emu_cq_new(struct emu_nic *nic, struct ibv_context *c, uint32_t ncqe, void *buf,
			  volatile uint32_t *dbrec, int devx);
void emu_cq_free(struct emu_nic *nic, struct emu_cq *cq);
struct emu_cq *emu_cq_new_sized(struct emu_nic *nic, struct ibv_context *c, uint32_t ncqe, uint32_t cqe_size,
				void *buf, volatile uint32_t *dbrec, int devx);
void emu_cq_init_ex_ops(struct emu_cq *cq);
void *emu_ctx_cq_uar(struct ibv_context *c);
void emu_qp_apply_reset(struct emu_qp *qp);
struct emu_srq *emu_srq_lookup(uint32_t srqn);

struct emu_devx_uar { struct mlx5dv_devx_uar pub; struct emu_uar *uar; struct emu_nic *nic; };
struct emu_devx_obj { int kind; void *object; struct emu_nic *nic; struct ibv_context *ctx; };
enum { OBJ_QP = 1, OBJ_CQ = 2, OBJ_DCT = 3 };

/* The command's output header (status, syndrome), and the errno the call
 * returns for it (0 for OK, EOPNOTSUPP for BAD_OP, EINVAL else; rdma-core
 * returns the kernel's errno, which for a failed command is EREMOTEIO or
 * EINVAL -- callers read the status). */
static inline int cmd_status(void *out, size_t outlen, int status, uint32_t syndrome)
{
	if (out && outlen >= 8) {
		memset(out, 0, outlen < 16 ? outlen : 16);
		st_devx_set(out, ST_PRM_OUT_STATUS, (uint64_t)status);
		st_devx_set(out, ST_PRM_OUT_SYNDROME, syndrome);
	}
	return status == CMD_OK ? 0 : (status == CMD_BAD_OP ? EOPNOTSUPP : EINVAL);
}

#endif
