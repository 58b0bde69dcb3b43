/*
 * The libmlx5 direct-verbs (mlx5dv / DevX) ABI pieces the tracer uses, declared here so that it
 * builds without rdma-core's development headers (issue 17, F27).  Layouts and values are those of
 * rdma-core's public header <infiniband/mlx5dv.h> as of rdma-core v44 (Debian 12's libibverbs-dev
 * 44.0); nothing here is rdma-core's code.  tests/test_abi_conformance.py checks them against the
 * real header wherever it is installed.
 *
 * Declared: what mlx5dv_init_obj hands back for a verbs QP (the SQ, doorbell record and BlueFlame
 * register a CPU WQE writer uses), the UAR and UMEM objects, and the prototypes of the functions
 * the mlx5 provider wraps.  DevX command buffers are PRM layouts (sigmatrace/mlx5.h), not these.
 */
#ifndef ST_ABI_MLX5DV_H
#define ST_ABI_MLX5DV_H

/* the public header this file follows (build_info.json) */
#define ST_ABI_MLX5DV_FROM "rdma-core v44 infiniband/mlx5dv.h"

#include <stdint.h>
#include <sys/types.h> /* off_t */

#include "abi/verbs.h"

struct mlx5dv_context_attr;
struct mlx5dv_qp_init_attr;
struct mlx5dv_devx_obj;
struct mlx5dv_cq;
struct mlx5dv_srq;
struct mlx5dv_rwq;
struct mlx5dv_dm;
struct mlx5dv_ah;
struct mlx5dv_pd;
struct ibv_wq;
struct ibv_dm;

struct mlx5dv_qp {
	__be32 *dbrec;
	struct {
		void *buf;
		uint32_t wqe_cnt;
		uint32_t stride;
	} sq;
	struct {
		void *buf;
		uint32_t wqe_cnt;
		uint32_t stride;
	} rq;
	struct {
		void *reg;
		uint32_t size;
	} bf;
	uint64_t comp_mask;
	off_t uar_mmap_offset;
	uint32_t tirn;
	uint32_t tisn;
	uint32_t rqn;
	uint32_t sqn;
	uint64_t tir_icm_addr;
};

/* mlx5dv_init_obj's in/out pairs; the tracer reads the QP pair (MLX5DV_OBJ_QP) */
struct mlx5dv_obj {
	struct {
		struct ibv_qp *in;
		struct mlx5dv_qp *out;
	} qp;
	struct {
		struct ibv_cq *in;
		struct mlx5dv_cq *out;
	} cq;
	struct {
		struct ibv_srq *in;
		struct mlx5dv_srq *out;
	} srq;
	struct {
		struct ibv_wq *in;
		struct mlx5dv_rwq *out;
	} rwq;
	struct {
		struct ibv_dm *in;
		struct mlx5dv_dm *out;
	} dm;
	struct {
		struct ibv_ah *in;
		struct mlx5dv_ah *out;
	} ah;
	struct {
		struct ibv_pd *in;
		struct mlx5dv_pd *out;
	} pd;
};

enum mlx5dv_obj_type { MLX5DV_OBJ_QP = 1 << 0 };

struct mlx5dv_devx_umem {
	uint32_t umem_id;
};

enum mlx5dv_devx_umem_in_mask { MLX5DV_UMEM_MASK_DMABUF = 1 << 0 };

struct mlx5dv_devx_umem_in {
	void *addr; /* with MLX5DV_UMEM_MASK_DMABUF: the offset in the dma-buf */
	size_t size;
	uint32_t access;
	uint64_t pgsz_bitmap;
	uint64_t comp_mask;
	int dmabuf_fd;
};

struct mlx5dv_devx_uar {
	void *reg_addr;
	void *base_addr;
	uint32_t page_id;
	off_t mmap_off;
	uint64_t comp_mask;
};

/* ---- the exported functions the mlx5 provider wraps (providers/mlx5/mlx5_shims.def) ---- */
struct ibv_context *mlx5dv_open_device(struct ibv_device *device, struct mlx5dv_context_attr *attr);
struct ibv_qp *mlx5dv_create_qp(struct ibv_context *context, struct ibv_qp_init_attr_ex *qp_attr,
				struct mlx5dv_qp_init_attr *mlx5_qp_attr);
int mlx5dv_init_obj(struct mlx5dv_obj *obj, uint64_t obj_type);
struct mlx5dv_devx_uar *mlx5dv_devx_alloc_uar(struct ibv_context *context, uint32_t flags);
void mlx5dv_devx_free_uar(struct mlx5dv_devx_uar *devx_uar);
struct mlx5dv_devx_umem *mlx5dv_devx_umem_reg(struct ibv_context *ctx, void *addr, size_t size, uint32_t access);
struct mlx5dv_devx_umem *mlx5dv_devx_umem_reg_ex(struct ibv_context *ctx, struct mlx5dv_devx_umem_in *umem_in);
int mlx5dv_devx_umem_dereg(struct mlx5dv_devx_umem *umem);
struct mlx5dv_devx_obj *mlx5dv_devx_obj_create(struct ibv_context *context, const void *in, size_t inlen, void *out,
					       size_t outlen);
int mlx5dv_devx_obj_query(struct mlx5dv_devx_obj *obj, const void *in, size_t inlen, void *out, size_t outlen);
int mlx5dv_devx_obj_modify(struct mlx5dv_devx_obj *obj, const void *in, size_t inlen, void *out, size_t outlen);
int mlx5dv_devx_obj_destroy(struct mlx5dv_devx_obj *obj);
int mlx5dv_devx_general_cmd(struct ibv_context *context, const void *in, size_t inlen, void *out, size_t outlen);
int mlx5dv_devx_query_eqn(struct ibv_context *context, uint32_t vector, uint32_t *eqn);
int mlx5dv_devx_qp_query(struct ibv_qp *qp, const void *in, size_t inlen, void *out, size_t outlen);
int mlx5dv_devx_qp_modify(struct ibv_qp *qp, const void *in, size_t inlen, void *out, size_t outlen);

#endif /* ST_ABI_MLX5DV_H */
