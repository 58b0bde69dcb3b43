/*
 * libibverbs provider: the device contexts.
 *
 * Every context handed to the application (ibv_open_device, and
 * mlx5dv_open_device in the mlx5 provider) gets an entry in st_ibv_ctxs, its
 * hot ops patched (ibv_hot.c), an IBV_OPEN_DEVICE event, and its NIC's
 * identity (device name, GUIDs, ports, LIDs, GIDs) in the process header,
 * where the correlator finds which NIC a trace ran on.
 */
#include <endian.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "ibv_internal.h"

struct st_ibv_ctx st_ibv_ctxs[ST_IBV_MAX_CTX];

/* ---- identity ------------------------------------------------------------ */
void st_ibv_gid_str(char out[40], const uint8_t g[16])
{
	snprintf(out, 40, "%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x",
		 g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], g[10], g[11], g[12], g[13],
		 g[14], g[15]);
}

static int gid_zero(const uint8_t g[16])
{
	for (int i = 0; i < 16; i++)
		if (g[i])
			return 0;
	return 1;
}

static int query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *a)
{
	memset(a, 0, sizeof(*a));
	struct verbs_context *vctx = verbs_get_ctx_op(ctx, query_port);
	if (vctx)
		return vctx->query_port(ctx, port, a, sizeof(*a));
	/* the exported symbol takes the older, shorter struct: same prefix */
	static int (*qp_fn)(struct ibv_context *, uint8_t, struct ibv_port_attr *);
	return ST_REAL(qp_fn, "ibv_query_port") ? qp_fn(ctx, port, a) : -1;
}

/* The NIC list of the process header: every device opened so far, in the
 * order of first open (the correlator takes the first as the default NIC). */
#define NIC_JSON_CAP 12288
static char nic_entries[ST_IBV_MAX_CTX][1536];
static char nic_names[ST_IBV_MAX_CTX][ST_IBV_NAME_MAX];
static unsigned n_nics;

static void publish_nic(const char *name, const char *entry)
{
	static char all[NIC_JSON_CAP];
	pthread_mutex_lock(&st_ibv_lock);
	unsigned i;
	for (i = 0; i < n_nics; i++)
		if (!strcmp(nic_names[i], name))
			break;
	if (i == n_nics && n_nics < ST_IBV_MAX_CTX)
		n_nics++;
	if (i < n_nics) {
		snprintf(nic_names[i], ST_IBV_NAME_MAX, "%s", name);
		size_t el = strlen(entry);
		if (el >= sizeof(nic_entries[i]))
			el = 0; /* too long: an empty entry would be broken JSON, keep "{}" */
		memcpy(nic_entries[i], el ? entry : "{}", el ? el + 1 : 3);
	}
	size_t len = 0;
	all[len++] = '[';
	for (unsigned k = 0; k < n_nics; k++) {
		size_t el = strlen(nic_entries[k]);
		if (len + el + 3 >= sizeof(all))
			break;
		if (k)
			all[len++] = ',';
		memcpy(all + len, nic_entries[k], el);
		len += el;
	}
	all[len++] = ']';
	all[len] = 0;
	st_process_set_nics(all);
	pthread_mutex_unlock(&st_ibv_lock);
}

/* Device name, node GUID, ports with LID and GIDs: into the process header
 * (contract 3 of ARCHITECTURE.md) and into the IBV_OPEN_DEVICE side JSON. */
static void describe_context(struct st_ibv_ctx *c, struct ibv_context *ctx, struct st_json *j)
{
	static int (*query_device)(struct ibv_context *, struct ibv_device_attr *);
	static int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
	ST_REAL(query_device, "ibv_query_device");
	ST_REAL(query_gid, "ibv_query_gid");

	struct ibv_device_attr da;
	memset(&da, 0, sizeof(da));
	int have_da = query_device && query_device(ctx, &da) == 0;
	c->node_guid = have_da ? be64toh(da.node_guid) : 0;
	snprintf(c->name, sizeof(c->name), "%s", ctx->device ? ctx->device->name : "");

	st_json_open(j, NULL, '{');
	st_json_str(j, "name", c->name);
	char guid[24];
	snprintf(guid, sizeof(guid), "%016llx", (unsigned long long)c->node_guid);
	st_json_str(j, "node_guid", guid);
	if (have_da) {
		snprintf(guid, sizeof(guid), "%016llx", (unsigned long long)be64toh(da.sys_image_guid));
		st_json_str(j, "sys_image_guid", guid);
		st_json_uint(j, "vendor_id", da.vendor_id);
		st_json_uint(j, "vendor_part_id", da.vendor_part_id);
		st_json_str(j, "fw_ver", da.fw_ver);
	}
	st_json_open(j, "ports", '[');
	unsigned nports = have_da && da.phys_port_cnt ? da.phys_port_cnt : 1;
	for (unsigned p = 1; p <= nports && p <= 8; p++) {
		struct ibv_port_attr pa;
		if (query_port(ctx, (uint8_t)p, &pa) != 0)
			continue;
		st_json_open(j, NULL, '{');
		st_json_uint(j, "port", p);
		st_json_uint(j, "lid", pa.lid);
		st_json_uint(j, "state", pa.state);
		st_json_uint(j, "active_mtu", pa.active_mtu);
		st_json_str(j, "link_layer", pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand");
		st_json_open(j, "gids", '[');
		/* a RoCE table can have hundreds of entries: the first 16 cover
		 * the ones in use (RoCEv1/v2 x IPv4/IPv6 per address) */
		int tbl = pa.gid_tbl_len > 0 ? pa.gid_tbl_len : 1;
		for (int gi = 0; gi < tbl && gi < 16 && query_gid; gi++) {
			union ibv_gid g;
			if (query_gid(ctx, (uint8_t)p, gi, &g) != 0 || gid_zero(g.raw))
				continue;
			char s[40];
			st_ibv_gid_str(s, g.raw);
			st_json_str(j, NULL, s);
		}
		st_json_close(j, ']');
		st_json_close(j, '}');
	}
	st_json_close(j, ']');
	st_json_close(j, '}');
}

void st_ibv_context_opened(struct ibv_context *ctx)
{
	if (!ctx || !st_provider_on(ST_PROV_IBV))
		return;
	int saved = errno;
	pthread_mutex_lock(&st_ibv_lock);
	/* its own entry (the address came back), else a closed context's (its
	 * copied ops are replaced by this context's), else a new one: the table
	 * holds 64 open contexts, not 64 contexts ever */
	struct st_ibv_ctx *c = NULL, *closed = NULL;
	for (unsigned i = 0; i < ST_IBV_MAX_CTX; i++) {
		struct ibv_context *k = st_ibv_ctxs[i].ctx;
		if (k == ctx || !k) {
			c = &st_ibv_ctxs[i];
			break;
		}
		if (!closed && st_ibv_ctxs[i].closed)
			closed = &st_ibv_ctxs[i];
	}
	if ((!c || !c->ctx) && closed)
		c = closed;
	if (c && c->ctx == ctx && !c->closed) { /* already seen (mlx5dv_open_device -> ibv_open_device) */
		pthread_mutex_unlock(&st_ibv_lock);
		errno = saved;
		return;
	}
	if (c) {
		int is_new;
		if (c->ctx != ctx) { /* a closed context's entry: nothing of it stays */
			c->create_qp_ex = NULL;
			c->create_cq_ex = NULL;
		}
		c->id = st_obj_id(ctx, &is_new);
		c->closed = 0;
		/* originals first, then the key, then the wrappers go in: a hot
		 * wrapper always finds the entry of the context it runs for */
		st_ibv_patch_ops(c, ctx);
	}
	pthread_mutex_unlock(&st_ibv_lock);
	if (!c) {
		st_warn("ibv: more than %d device contexts; context %p is not traced", ST_IBV_MAX_CTX, (void *)ctx);
		errno = saved;
		return;
	}

	char buf[2048];
	struct st_json j;
	st_json_init(&j, buf, sizeof(buf));
	st_rdma_depth++; /* the queries below are libibverbs calls too */
	describe_context(c, ctx, &j);
	st_rdma_depth--;
	if (!j.overflow)
		publish_nic(c->name, buf);
	/* the event's JSON: the same object plus the context id */
	char ev[2200];
	int n = snprintf(ev, sizeof(ev), "{\"ctx\":%u,\"device\":%s}", c->id, j.overflow ? "null" : buf);
	uint64_t side = (n > 0 && (size_t)n < sizeof(ev)) ? st_side_json(ev, (size_t)n) : 0;
	st_ev(ST_EV_IBV_OPEN_DEVICE, 0, c->id, side);
	errno = saved;
}
