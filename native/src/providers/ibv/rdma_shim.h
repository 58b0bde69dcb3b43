/*
 * The shape of a verbs / mlx5dv lifecycle shim, expanded from the tables
 * ibv_shims.def and ../mlx5/mlx5_shims.def (X-macros, as rdma-core and
 * Linux build their command and ops tables).
 *
 * Every exported libibverbs / libmlx5 function we trace does the same five
 * things; only what it records differs.  A table row
 *
 *   ST_SHIM(fail, provider, ret_type, name, (params), (args), skip, note, record)
 *
 * becomes, with ST_RDMA_SHIM below:
 *
 *   static ret_type (*real_<name>)(params);
 *   ST_EXPORT ret_type name(params)
 *   {
 *       resolve real_<name> once; missing: `fail`
 *           PTR  errno = ENOSYS, return NULL   (returns an object)
 *           INT  return ENOSYS                   (returns an errno value)
 *       not recording (provider off, or the library calling itself) or
 *       `skip` true: forward, nothing else
 *       note = `note`   what the record needs and the call may free
 *       ret = the call, under the RDMA re-entrancy guard
 *       `record`        a statement of ret, note and the arguments
 *       return ret;
 *   }
 *
 * ST_SHIM_BY_HAND(provider, ret_type, name, (params)) rows are shims whose
 * shape is irregular (work before the guard, several notes): the table still
 * declares their real_<name> and lists them for the hook table, the body is
 * written out in the provider's file.
 *
 * Everything expands in place: no extra call, no function pointer beyond
 * the real function's, so a generated shim costs what the hand-written one
 * did.
 */
#ifndef ST_PROV_RDMA_SHIM_H
#define ST_PROV_RDMA_SHIM_H

#include <errno.h>

#include "ibv_internal.h"

#define ST_RDMA_FAIL_PTR                \
	do {                            \
		errno = ENOSYS;         \
		return NULL;            \
	} while (0)
#define ST_RDMA_FAIL_INT return ENOSYS

/* Pass 1 of a table: the real function pointers (all rows). */
#define ST_RDMA_REAL(ret_type, name, params) static ret_type(*real_##name) params;

/* Pass 2: the generated shims (ST_SHIM rows). */
#define ST_RDMA_SHIM(fail, provider, ret_type, name, params, args, skip, note_expr, record) \
	ST_EXPORT ret_type name params                                                      \
	{                                                                                   \
		if (!ST_REAL(real_##name, #name))                                           \
			ST_RDMA_FAIL_##fail;                                                \
		if (!st_rdma_should(provider) || (skip))                                    \
			return real_##name args;                                            \
		__auto_type note __attribute__((unused)) = (note_expr);                     \
		st_rdma_enter();                                                            \
		ret_type ret = real_##name args;                                            \
		st_rdma_leave();                                                            \
		record;                                                                     \
		return ret;                                                                 \
	}

/* Pass 3: the hook table rows (all rows): symbol shims double as dlsym /
 * dlvsym injection hooks. */
#define ST_RDMA_HOOK(provider, name) {#name, (void *)name, (void **)&real_##name, provider},

/* Records shared by several rows. */

/* A created object: a fresh id, one event carrying `arg`. */
#define ST_RDMA_CREATED(ret, type, arg)                                       \
	do {                                                                  \
		if (ret) {                                                    \
			int saved = errno, is_new;                            \
			st_ev(type, 0, st_obj_id(ret, &is_new), (arg));       \
			errno = saved;                                        \
		}                                                             \
	} while (0)

/* A destroyed object, `id` noted before the call: one event if it went. */
#define ST_RDMA_DESTROYED(ret, type, id)         \
	do {                                     \
		int saved = errno;               \
		if ((ret) == 0)                  \
			st_ev(type, 0, id, 0);   \
		errno = saved;                   \
	} while (0)

/* A destroyed object with a small id (core/objmap.c), `id` noted before the
 * call: one event if it went, and its id entry freed (the address may come
 * back as another object). */
#define ST_RDMA_DESTROYED_OBJ(ret, type, id, obj)  \
	do {                                       \
		int saved = errno;                 \
		if ((ret) == 0) {                  \
			st_ev(type, 0, id, 0);     \
			st_obj_forget(obj);        \
		}                                  \
		errno = saved;                     \
	} while (0)

#endif /* ST_PROV_RDMA_SHIM_H */
