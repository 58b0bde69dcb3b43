/* libibverbs.so.1 of the emulated HCA: the device list, opening a context
 * (it starts the process's NIC, nic.c) and the device/port/GID/P_Key
 * queries.  The identity comes from the NIC's configuration, so a query
 * before any ibv_open_device starts nothing. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "emu_internal.h"

static struct ibv_device g_dev;
static int g_dev_ready;

static void dev_init(void)
{
	if (g_dev_ready)
		return;
	memset(&g_dev, 0, sizeof g_dev);
	emu_identity(g_dev.name, sizeof g_dev.name, NULL, NULL, NULL);
	g_dev.node_type = IBV_NODE_CA;
	g_dev.transport_type = IBV_TRANSPORT_IB;
	/* UCX looks for /dev/infiniband/<dev_name> (st-emu-ns provides it) */
	snprintf(g_dev.dev_name, sizeof g_dev.dev_name, "uverbs0");
	emu_sysfs_paths(g_dev.ibdev_path, sizeof g_dev.ibdev_path, g_dev.dev_path, sizeof g_dev.dev_path);
	g_dev_ready = 1;
}

/* ---- devices ---------------------------------------------------------------- */
EXPORT struct ibv_device **ibv_get_device_list(int *num)
{
	dev_init();
	struct ibv_device **l = calloc(2, sizeof *l);
	if (!l) {
		errno = ENOMEM;
		return NULL;
	}
	l[0] = &g_dev;
	if (num)
		*num = 1;
	return l;
}

EXPORT void ibv_free_device_list(struct ibv_device **list) { free(list); }
EXPORT const char *ibv_get_device_name(struct ibv_device *d) { return d->name; }
EXPORT __be64 ibv_get_device_guid(struct ibv_device *d)
{
	uint64_t guid;
	emu_identity(NULL, 0, &guid, NULL, NULL);
	return htobe64(guid);
}
EXPORT int ibv_get_device_index(struct ibv_device *d) { return 0; }

/* ---- context --------------------------------------------------------------- */
static int emu_query_port_op(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a, size_t len);
static int emu_query_device_ex(struct ibv_context *c, const struct ibv_query_device_ex_input *in,
			       struct ibv_device_attr_ex *attr, size_t sz);

EXPORT struct ibv_context *ibv_open_device(struct ibv_device *dev)
{
	struct emu_context *e = emu_zalloc(sizeof *e);
	if (!e)
		return NULL;
	e->nic = emu_nic_get();
	if (!e->nic) {
		free(e);
		errno = ENODEV;
		return NULL;
	}
	struct ibv_context *c = &e->vctx.context;
	c->device = dev;
	c->ops.post_send = emu_post_send;
	c->ops.post_recv = emu_post_recv;
	c->ops.poll_cq = emu_poll_cq;
	c->ops.req_notify_cq = emu_req_notify_cq;
	c->ops.post_srq_recv = emu_post_srq_recv;
	c->cmd_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
	/* async events (async.c): the NIC writes them into this pipe, the
	 * application reads them with ibv_get_async_event (blocking unless it
	 * makes async_fd non-blocking, as UCX does) */
	int p[2];
	if (pipe2(p, O_CLOEXEC) == 0) {
		c->async_fd = p[0];
		e->async_wfd = p[1];
		fcntl(p[1], F_SETFL, O_NONBLOCK);
	} else {
		c->async_fd = -1;
		e->async_wfd = -1;
	}
	c->num_comp_vectors = 1;
	pthread_mutex_init(&c->mutex, NULL);
	c->abi_compat = __VERBS_ABI_IS_EXTENDED;
	e->vctx.sz = sizeof(struct verbs_context);
	e->vctx.query_port = emu_query_port_op;
	e->vctx.query_device_ex = emu_query_device_ex;
	e->vctx.create_qp_ex = emu_create_qp_ex;
	e->vctx.create_srq_ex = emu_create_srq_ex;
	e->vctx.alloc_parent_domain = emu_alloc_parent_domain; /* pd.c */
	return c;
}

EXPORT int ibv_close_device(struct ibv_context *c)
{
	struct emu_context *e = to_ectx(c);
	if (c->cmd_fd >= 0)
		close(c->cmd_fd);
	if (c->async_fd >= 0)
		close(c->async_fd);
	if (e->async_wfd >= 0)
		close(e->async_wfd);
	if (e->cq_uar) {
		pthread_mutex_lock(&e->nic->lock);
		emu_uar_free(e->nic, e->cq_uar);
		pthread_mutex_unlock(&e->nic->lock);
	}
	emu_nic_put(e->nic);
	free(e);
	return 0;
}

/* exported for libmlx5.so.1 (mlx5dv_open_device) */
EXPORT struct emu_nic *emu_ctx_nic(struct ibv_context *c) { return to_ectx(c)->nic; }

EXPORT int ibv_query_device(struct ibv_context *c, struct ibv_device_attr *a)
{
	uint64_t guid;
	emu_identity(NULL, 0, &guid, NULL, NULL);
	memset(a, 0, sizeof *a);
	snprintf(a->fw_ver, sizeof a->fw_ver, "16.99.9999 (sigmatrace-emu)");
	a->node_guid = htobe64(guid);
	a->sys_image_guid = htobe64(guid);
	a->max_mr_size = 1ull << 40;
	a->page_size_cap = 0xfffff000;
	a->vendor_id = 0x02c9;
	a->vendor_part_id = 4123;
	a->hw_ver = 0;
	a->max_qp = EMU_MAX_QP;
	a->max_qp_wr = 32768;
	a->device_cap_flags = IBV_DEVICE_PORT_ACTIVE_EVENT | IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_CHANGE_PHY_PORT |
			      IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_SRQ_RESIZE;
	a->max_sge = EMU_MAX_SGE - 2;
	a->max_sge_rd = EMU_MAX_SGE - 2;
	a->max_cq = EMU_MAX_CQ - 1;
	a->max_cqe = 4194303;
	a->max_mr = EMU_MAX_MR - 1;
	a->max_pd = 1 << 20;
	a->max_qp_rd_atom = 16;
	a->max_ee_rd_atom = 0;
	a->max_res_rd_atom = 16 * EMU_MAX_QP;
	a->max_qp_init_rd_atom = 16;
	a->atomic_cap = IBV_ATOMIC_HCA;
	a->max_srq = 255;
	a->max_srq_wr = 32767;
	a->max_srq_sge = EMU_MAX_SGE - 2;
	a->max_pkeys = 1;
	a->local_ca_ack_delay = 16;
	a->phys_port_cnt = 1;
	return 0;
}

static int emu_query_device_ex(struct ibv_context *c, const struct ibv_query_device_ex_input *in,
			       struct ibv_device_attr_ex *attr, size_t sz)
{
	struct ibv_device_attr_ex tmp;
	memset(&tmp, 0, sizeof tmp);
	ibv_query_device(c, &tmp.orig_attr);
	tmp.max_dm_size = 0;
	memcpy(attr, &tmp, sz < sizeof tmp ? sz : sizeof tmp);
	return 0;
}

static void fill_port(struct ibv_port_attr *a)
{
	uint32_t lid;
	emu_identity(NULL, 0, NULL, &lid, NULL);
	memset(a, 0, sizeof *a);
	a->state = IBV_PORT_ACTIVE;
	a->max_mtu = IBV_MTU_4096;
	a->active_mtu = IBV_MTU_4096;
	a->gid_tbl_len = 1;
	a->port_cap_flags = 0x02514868;
	a->max_msg_sz = 1u << 30;
	a->pkey_tbl_len = 1;
	a->lid = (uint16_t)lid;
	a->sm_lid = 1;
	a->lmc = 0;
	a->max_vl_num = 4;
	a->sm_sl = 0;
	a->subnet_timeout = 18;
	a->active_width = 2;   /* 4X */
	a->active_speed = 32;  /* EDR */
	a->phys_state = 5;     /* LinkUp */
	a->link_layer = IBV_LINK_LAYER_INFINIBAND;
}

static int emu_query_port_op(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a, size_t len)
{
	if (port != 1)
		return EINVAL;
	struct ibv_port_attr tmp;
	fill_port(&tmp);
	memcpy(a, &tmp, len < sizeof tmp ? len : sizeof tmp);
	return 0;
}

#undef ibv_query_port
EXPORT int ibv_query_port(struct ibv_context *c, uint8_t port, struct _compat_ibv_port_attr *a)
{
	if (port != 1)
		return EINVAL;
	struct ibv_port_attr tmp;
	fill_port(&tmp);
	memcpy(a, &tmp, offsetof(struct ibv_port_attr, port_cap_flags2));
	return 0;
}

EXPORT int ibv_query_gid(struct ibv_context *c, uint8_t port, int index, union ibv_gid *gid)
{
	if (port != 1 || index != 0) {
		errno = EINVAL;
		return -1;
	}
	emu_identity(NULL, 0, NULL, NULL, gid->raw);
	return 0;
}

EXPORT int _ibv_query_gid_ex(struct ibv_context *c, uint32_t port, uint32_t index, struct ibv_gid_entry *entry,
			     uint32_t flags, size_t entry_size)
{
	if (port != 1 || index != 0)
		return EINVAL;
	struct ibv_gid_entry e;
	memset(&e, 0, sizeof e);
	emu_identity(NULL, 0, NULL, NULL, e.gid.raw);
	e.gid_index = 0;
	e.port_num = 1;
	e.gid_type = IBV_GID_TYPE_IB;
	memcpy(entry, &e, entry_size < sizeof e ? entry_size : sizeof e);
	return 0;
}

EXPORT ssize_t _ibv_query_gid_table(struct ibv_context *c, struct ibv_gid_entry *entries, size_t max,
				    uint32_t flags, size_t entry_size)
{
	if (max < 1)
		return -EINVAL;
	int r = _ibv_query_gid_ex(c, 1, 0, entries, 0, entry_size);
	return r ? -r : 1;
}

EXPORT int ibv_query_gid_type(struct ibv_context *c, uint8_t port, unsigned int index, int *type)
{
	if (port != 1 || index != 0)
		return -1;
	*type = 0; /* IBV_GID_TYPE_SYSFS_IB_ROCE_V1 / IB */
	return 0;
}

EXPORT int ibv_query_pkey(struct ibv_context *c, uint8_t port, int index, __be16 *pkey)
{
	if (port != 1 || index != 0) {
		errno = EINVAL;
		return -1;
	}
	*pkey = htobe16(0xffff);
	return 0;
}

EXPORT int ibv_get_pkey_index(struct ibv_context *c, uint8_t port, __be16 pkey)
{
	return (be16toh(pkey) & 0x7fff) == 0x7fff ? 0 : -1;
}
