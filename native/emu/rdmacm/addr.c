/* Emulated librdmacm: addresses.  Which node owns an address, the port spaces,
 * rdma_getaddrinfo, rdma_bind_addr, rdma_resolve_addr and rdma_resolve_route.
 *
 * Address map: the node with LID L owns the IPv4 loopback address
 * 127.0.<L/256>.<L%256> (LID 1 is 127.0.0.1), its port GID as an AF_IB
 * address, and whatever SIGMATRACE_EMU_IP_ADDRS lists (IPv4/IPv6, comma
 * separated).  Other processes find an owner through the agents' registry
 * files (agent.c).  Port spaces (TCP, UDP, IB, IPoIB) are per node.
 *
 * A node's loopback: a *passive* lookup (RAI_PASSIVE: an address to bind)
 * that resolves to a loopback address this node does not own ("localhost",
 * 127.0.0.1 on a node other than LID 1) answers the node's own loopback
 * address.  On one real host a bind to 127.0.0.1 takes the host's own RDMA
 * device (the kernel's loopback binding); the emulated nodes share the one
 * host's loopback names, and each must bind its own.  Destinations keep the
 * map: 127.0.0.1 as a destination is LID 1. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>

#include "cma.h"

socklen_t cma_addrlen(const struct sockaddr *a)
{
	if (!a)
		return 0;
	switch (a->sa_family) {
	case AF_INET: return sizeof(struct sockaddr_in);
	case AF_INET6: return sizeof(struct sockaddr_in6);
	case AF_IB: return sizeof(struct sockaddr_ib);
	default: return 0;
	}
}

int cma_addr_is_any(const struct sockaddr *a)
{
	switch (a->sa_family) {
	case AF_INET: return ((const struct sockaddr_in *)a)->sin_addr.s_addr == htonl(INADDR_ANY);
	case AF_INET6: return IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)a)->sin6_addr);
	case AF_IB: {
		const struct sockaddr_ib *s = (const void *)a;
		static const uint8_t zero[16];
		return !memcmp(s->sib_addr.sib_raw, zero, 16);
	}
	default: return 0;
	}
}

int cma_addr_is_loopback(const struct sockaddr *a)
{
	if (a->sa_family == AF_INET)
		return (ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) >> 24) == 127;
	if (a->sa_family == AF_INET6)
		return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)a)->sin6_addr);
	return 0;
}

int cma_addr_equal(const struct sockaddr *a, const struct sockaddr *b)
{
	if (a->sa_family != b->sa_family)
		return 0;
	switch (a->sa_family) {
	case AF_INET:
		return ((const struct sockaddr_in *)a)->sin_addr.s_addr == ((const struct sockaddr_in *)b)->sin_addr.s_addr;
	case AF_INET6:
		return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr, 16);
	case AF_IB:
		return !memcmp(((const struct sockaddr_ib *)a)->sib_addr.sib_raw, ((const struct sockaddr_ib *)b)->sib_addr.sib_raw, 16);
	default:
		return 0;
	}
}

uint16_t cma_addr_port(const struct sockaddr *a)
{
	switch (a->sa_family) {
	case AF_INET: return ntohs(((const struct sockaddr_in *)a)->sin_port);
	case AF_INET6: return ntohs(((const struct sockaddr_in6 *)a)->sin6_port);
	case AF_IB: return (uint16_t)be64toh(((const struct sockaddr_ib *)a)->sib_sid);
	default: return 0;
	}
}

void cma_addr_set_port(struct sockaddr *a, uint16_t port, int ps)
{
	switch (a->sa_family) {
	case AF_INET: ((struct sockaddr_in *)a)->sin_port = htons(port); break;
	case AF_INET6: ((struct sockaddr_in6 *)a)->sin6_port = htons(port); break;
	case AF_IB: {
		struct sockaddr_ib *s = (void *)a;
		s->sib_sid = htobe64(((uint64_t)ps << 16) | port);
		s->sib_sid_mask = htobe64(RDMA_IB_IP_PS_MASK | RDMA_IB_IP_PORT_MASK);
		break;
	}
	}
}

const char *cma_addr_str(const struct sockaddr *a, char *buf, size_t n)
{
	char h[INET6_ADDRSTRLEN] = "?";
	if (!a)
		snprintf(buf, n, "(none)");
	else if (a->sa_family == AF_INET)
		snprintf(buf, n, "%s:%u", inet_ntop(AF_INET, &((const struct sockaddr_in *)a)->sin_addr, h, sizeof h),
			 cma_addr_port(a));
	else if (a->sa_family == AF_INET6)
		snprintf(buf, n, "[%s]:%u", inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)a)->sin6_addr, h, sizeof h),
			 cma_addr_port(a));
	else if (a->sa_family == AF_IB)
		snprintf(buf, n, "ib[%s]:%u", inet_ntop(AF_INET6, ((const struct sockaddr_ib *)a)->sib_addr.sib_raw, h, sizeof h),
			 cma_addr_port(a));
	else
		snprintf(buf, n, "family %d", a->sa_family);
	return buf;
}

void cma_loopback_of(uint32_t lid, struct sockaddr_in *out)
{
	memset(out, 0, sizeof *out);
	out->sin_family = AF_INET;
	out->sin_addr.s_addr = htonl(0x7f000000u | (lid & 0xffff));
}

/* SIGMATRACE_EMU_IP_ADDRS: the extra addresses this node owns. */
int cma_parse_addr_list(const char *s)
{
	cma.naddrs = 0;
	if (!s)
		return 0;
	char buf[1024];
	snprintf(buf, sizeof buf, "%s", s);
	for (char *save = NULL, *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
		if (cma.naddrs >= (int)(sizeof cma.addrs / sizeof cma.addrs[0]))
			break;
		struct sockaddr_storage *ss = &cma.addrs[cma.naddrs];
		memset(ss, 0, sizeof *ss);
		struct sockaddr_in *in = (void *)ss;
		struct sockaddr_in6 *in6 = (void *)ss;
		if (inet_pton(AF_INET, tok, &in->sin_addr) == 1) {
			in->sin_family = AF_INET;
		} else if (inet_pton(AF_INET6, tok, &in6->sin6_addr) == 1) {
			in6->sin6_family = AF_INET6;
		} else {
			fprintf(stderr, "sigmatrace-emu: SIGMATRACE_EMU_IP_ADDRS: '%s' is not an IP address (ignored)\n", tok);
			continue;
		}
		cma.naddrs++;
	}
	return cma.naddrs;
}

int cma_addr_owned(const struct sockaddr *a)
{
	if (a->sa_family == AF_INET) {
		struct sockaddr_in lo;
		cma_loopback_of(cma.lid, &lo);
		if (cma_addr_equal(a, (struct sockaddr *)&lo))
			return 1;
	}
	if (a->sa_family == AF_IB)
		return !memcmp(((const struct sockaddr_ib *)a)->sib_addr.sib_raw, cma.gid, 16);
	for (int i = 0; i < cma.naddrs; i++)
		if (cma_addr_equal(a, (struct sockaddr *)&cma.addrs[i]))
			return 1;
	return 0;
}

/* This node's source address for a destination of `family` (loopback: the
 * destination is a loopback address).  ss_family 0 when the node has none. */
void cma_self_addr(int family, int loopback, struct sockaddr_storage *out)
{
	memset(out, 0, sizeof *out);
	if (family == AF_IB) {
		struct sockaddr_ib *s = (void *)out;
		s->sib_family = AF_IB;
		s->sib_pkey = htobe16(0xffff);
		memcpy(s->sib_addr.sib_raw, cma.gid, 16);
		return;
	}
	if (family == AF_INET && loopback) {
		cma_loopback_of(cma.lid, (struct sockaddr_in *)out);
		return;
	}
	for (int i = 0; i < cma.naddrs; i++)
		if (cma.addrs[i].ss_family == family) {
			*out = cma.addrs[i];
			return;
		}
	if (family == AF_INET)
		cma_loopback_of(cma.lid, (struct sockaddr_in *)out);
}

void cma_fill_ibaddr(struct cm_id *c)
{
	struct rdma_ib_addr *ib = &c->id.route.addr.addr.ibaddr;
	memcpy(ib->sgid.raw, cma.gid, 16);
	memcpy(ib->dgid.raw, c->peer.gid, 16);
	ib->pkey = htobe16(0xffff);
}

void cma_fill_path(struct cm_id *c)
{
	struct ibv_sa_path_rec *p = &c->path;
	memset(p, 0, sizeof *p);
	memcpy(p->sgid.raw, cma.gid, 16);
	memcpy(p->dgid.raw, c->peer.gid, 16);
	p->slid = htobe16((uint16_t)cma.lid);
	p->dlid = htobe16((uint16_t)c->peer.lid);
	p->reversible = 1;
	p->numb_path = 1;
	p->pkey = htobe16(0xffff);
	p->mtu_selector = 2;
	p->mtu = IBV_MTU_4096;
	p->rate_selector = 2;
	p->rate = IBV_RATE_100_GBPS;
	p->packet_life_time_selector = 2;
	p->packet_life_time = 13;    /* -> QP timeout 14 (4.096 us * 2^14) */
	c->id.route.path_rec = p;
	c->id.route.num_paths = 1;
}

/* A (non-loopback) address of one of the host's interfaces. */
static int host_has_addr(const struct sockaddr *a)
{
	struct ifaddrs *ifs, *i;
	int found = 0;
	if (cma_addr_is_loopback(a) || getifaddrs(&ifs))
		return 0;
	for (i = ifs; i && !found; i = i->ifa_next)
		found = i->ifa_addr && cma_addr_equal(i->ifa_addr, a);
	freeifaddrs(ifs);
	return found;
}

/* ---- port spaces ----------------------------------------------------------- */
static int port_conflict(struct cm_id *self, int ps, uint16_t port, const struct sockaddr *a)
{
	for (struct cm_id *o = cma.ids; o; o = o->next) {
		if (o == self || o->destroyed || !o->bound || (int)o->id.ps != ps)
			continue;
		const struct sockaddr *oa = &o->id.route.addr.src_addr;
		if (cma_addr_port(oa) != port)
			continue;
		if (self->reuseaddr && o->reuseaddr && o->state != CS_LISTEN)
			continue;
		if (cma_addr_is_any(oa) || cma_addr_is_any(a) || cma_addr_equal(oa, a))
			return 1;
	}
	return 0;
}

/* Bind the id to `a` (port 0: an ephemeral one); an explicit bind to a
 * device's address puts the id on the device (`verbs`), the implicit one of
 * rdma_resolve_addr waits for the resolution.  Lock held. */
static int bind_locked(struct cm_id *c, const struct sockaddr *a, int explicit_bind)
{
	socklen_t len = cma_addrlen(a);
	if (!len)
		return cma_err(EAFNOSUPPORT);
	if (c->state != CS_IDLE || c->bound)
		return cma_err(EINVAL);
	if (!cma_addr_is_any(a) && !cma_addr_owned(a)) {
		char b[96];
		CMA_LOG("bind %s: not an address of this node (lid %u)", cma_addr_str(a, b, sizeof b), cma.lid);
		/* the host's own address on no emulated device: the kernel finds no
		 * RDMA device for it (ENODEV); any other: not local (EADDRNOTAVAIL) */
		return cma_err(host_has_addr(a) ? ENODEV : EADDRNOTAVAIL);
	}
	int ps = c->id.ps;   /* an AF_IB service ID's port space is the id's */
	uint16_t port = cma_addr_port(a);
	if (port) {
		if (port_conflict(c, ps, port, a))
			return cma_err(EADDRINUSE);
	} else {
		int tries = 0;
		do {
			port = (uint16_t)(32768 + (uint32_t)random() % 28232);
		} while (port_conflict(c, ps, port, a) && ++tries < 100000);
		if (tries >= 100000)
			return cma_err(EADDRINUSE);
	}
	memset(&c->id.route.addr.src_storage, 0, sizeof c->id.route.addr.src_storage);
	memcpy(&c->id.route.addr.src_storage, a, len);
	cma_addr_set_port(&c->id.route.addr.src_addr, port, ps);
	c->bound = 1;
	c->state = CS_ADDR_BOUND;
	if (explicit_bind && !cma_addr_is_any(a))
		cma_set_verbs(c);
	return 0;
}

CMA_EXPORT int rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *addr)
{
	if (!id || !cma_addrlen(addr))
		return cma_err(EINVAL);
	pthread_mutex_lock(&cma.lock);
	int r = bind_locked(to_cid(id), addr, 1);
	char b[96];
	CMA_LOG("bind id %p %s -> %d (%s)", (void *)id, cma_addr_str(addr, b, sizeof b), r, r ? strerror(errno) : "ok");
	pthread_mutex_unlock(&cma.lock);
	return r;
}

CMA_EXPORT int rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *src_addr, struct sockaddr *dst_addr,
				 int timeout_ms)
{
	if (!id || !cma_addrlen(dst_addr) || (src_addr && !cma_addrlen(src_addr)))
		return cma_err(EINVAL);
	struct cm_id *c = to_cid(id);
	pthread_mutex_lock(&cma.lock);
	int st = c->state;
	if (st != CS_IDLE && st != CS_ADDR_BOUND) {
		pthread_mutex_unlock(&cma.lock);
		return cma_err(EINVAL);
	}
	/* the source: given, bound, or this node's address towards dst */
	if (!c->bound) {
		struct sockaddr_storage src;
		if (src_addr && !cma_addr_is_any(src_addr)) {
			memcpy(&src, src_addr, cma_addrlen(src_addr));
		} else {
			cma_self_addr(dst_addr->sa_family, cma_addr_is_loopback(dst_addr), &src);
			if (!src.ss_family) {
				pthread_mutex_unlock(&cma.lock);
				return cma_err(ENETUNREACH);   /* no address of that family: no route */
			}
			if (src_addr)
				cma_addr_set_port((struct sockaddr *)&src, cma_addr_port(src_addr), c->id.ps);
		}
		if (bind_locked(c, (struct sockaddr *)&src, 0)) {
			pthread_mutex_unlock(&cma.lock);
			return -1;
		}
	} else if (cma_addr_is_any(&c->id.route.addr.src_addr)) {
		/* bound to the wildcard: the route picks the address, the port stays */
		struct sockaddr_storage src;
		uint16_t port = cma_addr_port(&c->id.route.addr.src_addr);
		cma_self_addr(dst_addr->sa_family, cma_addr_is_loopback(dst_addr), &src);
		if (!src.ss_family) {
			pthread_mutex_unlock(&cma.lock);
			return cma_err(ENETUNREACH);
		}
		cma_addr_set_port((struct sockaddr *)&src, port, c->id.ps);
		c->id.route.addr.src_storage = src;
	}
	memset(&c->id.route.addr.dst_storage, 0, sizeof c->id.route.addr.dst_storage);
	memcpy(&c->id.route.addr.dst_storage, dst_addr, cma_addrlen(dst_addr));
	c->state = CS_ADDR_QUERY;
	char b1[96], b2[96];
	if (cma_node_lookup(dst_addr, &c->peer) == 0) {
		cma_set_verbs(c);
		cma_fill_ibaddr(c);
		CMA_LOG("resolve %s -> %s: lid %u", cma_addr_str(&c->id.route.addr.src_addr, b1, sizeof b1),
			cma_addr_str(dst_addr, b2, sizeof b2), c->peer.lid);
		c->state = CS_ADDR_RESOLVED;
		cma_queue_event(c, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
	} else {
		/* nobody answers for that address (no ARP reply): the request times out */
		CMA_LOG("resolve %s: no node owns it (ADDR_ERROR in %d ms)", cma_addr_str(dst_addr, b2, sizeof b2),
			timeout_ms);
		cma_set_timer(c, CT_ADDR, timeout_ms > 0 ? timeout_ms : 1, -ETIMEDOUT);
	}
	pthread_mutex_unlock(&cma.lock);
	return cma_complete(id);
}

CMA_EXPORT int rdma_resolve_route(struct rdma_cm_id *id, int timeout_ms)
{
	if (!id)
		return cma_err(EINVAL);
	struct cm_id *c = to_cid(id);
	pthread_mutex_lock(&cma.lock);
	if (c->state != CS_ADDR_RESOLVED) {
		pthread_mutex_unlock(&cma.lock);
		return cma_err(EINVAL);
	}
	c->state = CS_ROUTE_QUERY;
	struct cm_node n;
	if (cma_node_lookup(&c->id.route.addr.dst_addr, &n) == 0 && n.lid == c->peer.lid) {
		/* the SA answers the PathRecord query after a round trip */
		cma_set_timer_us(c, CT_ROUTE, cma.sa_delay_us, 0);
	} else {
		/* the node went away: the path query is not answered */
		cma_set_timer(c, CT_ROUTE, timeout_ms > 0 ? timeout_ms : 1, -ETIMEDOUT);
	}
	pthread_mutex_unlock(&cma.lock);
	return cma_complete(id);
}

CMA_EXPORT __be16 rdma_get_src_port(struct rdma_cm_id *id)
{
	return htons(cma_addr_port(&id->route.addr.src_addr));
}

CMA_EXPORT __be16 rdma_get_dst_port(struct rdma_cm_id *id)
{
	return htons(cma_addr_port(&id->route.addr.dst_addr));
}

/* ---- rdma_getaddrinfo --------------------------------------------------------- */
static int copy_sa(struct sockaddr **dst, socklen_t *len, const struct sockaddr *src, socklen_t slen)
{
	*dst = malloc(slen);
	if (!*dst)
		return cma_err(ENOMEM);
	memcpy(*dst, src, slen);
	*len = slen;
	return 0;
}

/* An IPv6 address as an AF_IB address (what real librdmacm does for
 * RAI_FAMILY + AF_IB + RAI_NUMERICHOST hints). */
static int to_ib(struct sockaddr **dst, socklen_t *len, const struct sockaddr *src, int ps)
{
	if (src->sa_family != AF_INET6)
		return cma_err(EINVAL);
	struct sockaddr_ib *s = calloc(1, sizeof *s);
	if (!s)
		return cma_err(ENOMEM);
	const struct sockaddr_in6 *in6 = (const void *)src;
	s->sib_family = AF_IB;
	s->sib_pkey = htobe16(0xffff);
	s->sib_flowinfo = in6->sin6_flowinfo;
	memcpy(s->sib_addr.sib_raw, &in6->sin6_addr, 16);
	s->sib_scope_id = in6->sin6_scope_id;
	uint16_t port = ntohs(in6->sin6_port);
	s->sib_sid = htobe64(((uint64_t)ps << 16) + port);
	s->sib_sid_mask = htobe64(RDMA_IB_IP_PS_MASK | (port ? RDMA_IB_IP_PORT_MASK : 0));
	*dst = (struct sockaddr *)s;
	*len = sizeof *s;
	return 0;
}

CMA_EXPORT void rdma_freeaddrinfo(struct rdma_addrinfo *res)
{
	while (res) {
		struct rdma_addrinfo *r = res;
		res = res->ai_next;
		free(r->ai_connect);
		free(r->ai_route);
		free(r->ai_src_canonname);
		free(r->ai_dst_canonname);
		free(r->ai_src_addr);
		free(r->ai_dst_addr);
		free(r);
	}
}

CMA_EXPORT int rdma_getaddrinfo(const char *node, const char *service, const struct rdma_addrinfo *hints,
				struct rdma_addrinfo **res)
{
	static const struct rdma_addrinfo nohints;
	if (!service && !node && !hints)
		return cma_err(EINVAL);
	if (cma_init())
		return -1;
	if (!hints)
		hints = &nohints;
	struct rdma_addrinfo *rai = calloc(1, sizeof *rai);
	if (!rai)
		return cma_err(ENOMEM);
	int ret = 0;
	if (node || service) {
		struct addrinfo ah, *ai = NULL;
		memset(&ah, 0, sizeof ah);
		if (hints->ai_flags & RAI_PASSIVE)
			ah.ai_flags |= AI_PASSIVE;
		if (hints->ai_flags & RAI_NUMERICHOST)
			ah.ai_flags |= AI_NUMERICHOST;
		if (hints->ai_family != AF_IB)
			ah.ai_family = hints->ai_family;
		if (hints->ai_qp_type == IBV_QPT_UD)
			ah.ai_socktype = SOCK_DGRAM;
		else if (hints->ai_qp_type)
			ah.ai_socktype = SOCK_STREAM;
		if (hints->ai_port_space == RDMA_PS_TCP)
			ah.ai_protocol = IPPROTO_TCP;
		else if (hints->ai_port_space == RDMA_PS_UDP || hints->ai_port_space == RDMA_PS_IPOIB)
			ah.ai_protocol = IPPROTO_UDP;
		ret = getaddrinfo(node, service, hints == &nohints ? NULL : &ah, &ai);
		if (ret) {
			free(rai);
			if (!errno)
				errno = ENOENT;
			return ret;
		}
		/* the first answer, like rdma-core */
		rai->ai_qp_type = hints->ai_qp_type ? hints->ai_qp_type
				  : ai->ai_socktype == SOCK_DGRAM ? IBV_QPT_UD : IBV_QPT_RC;
		rai->ai_port_space = hints->ai_port_space ? hints->ai_port_space
				     : ai->ai_protocol == IPPROTO_UDP ? RDMA_PS_UDP : RDMA_PS_TCP;
		int want_ib = (hints->ai_flags & RAI_FAMILY) && hints->ai_family == AF_IB &&
			      (hints->ai_flags & RAI_NUMERICHOST);
		if (ai->ai_flags & AI_PASSIVE) {
			rai->ai_flags = RAI_PASSIVE;
			if (ai->ai_canonname)
				rai->ai_src_canonname = strdup(ai->ai_canonname);
			rai->ai_family = want_ib ? AF_IB : ai->ai_family;
			struct sockaddr_in own;
			const struct sockaddr *src = ai->ai_addr;
			socklen_t srclen = ai->ai_addrlen;
			if (src->sa_family == AF_INET && cma_addr_is_loopback(src) && !cma_addr_owned(src)) {
				cma_loopback_of(cma.lid, &own);   /* this node's loopback (above) */
				own.sin_port = ((const struct sockaddr_in *)src)->sin_port;
				src = (const struct sockaddr *)&own;
				srclen = sizeof own;
			}
			ret = want_ib ? to_ib(&rai->ai_src_addr, &rai->ai_src_len, src, rai->ai_port_space)
				      : copy_sa(&rai->ai_src_addr, &rai->ai_src_len, src, srclen);
		} else {
			if (ai->ai_canonname)
				rai->ai_dst_canonname = strdup(ai->ai_canonname);
			rai->ai_family = want_ib ? AF_IB : ai->ai_family;
			ret = want_ib ? to_ib(&rai->ai_dst_addr, &rai->ai_dst_len, ai->ai_addr, rai->ai_port_space)
				      : copy_sa(&rai->ai_dst_addr, &rai->ai_dst_len, ai->ai_addr, ai->ai_addrlen);
		}
		freeaddrinfo(ai);
	} else {
		rai->ai_flags = hints->ai_flags;
		rai->ai_family = hints->ai_family;
		rai->ai_qp_type = hints->ai_qp_type;
		rai->ai_port_space = hints->ai_port_space;
		if (hints->ai_dst_len)
			ret = copy_sa(&rai->ai_dst_addr, &rai->ai_dst_len, hints->ai_dst_addr, hints->ai_dst_len);
	}
	if (!ret && !rai->ai_src_len && hints->ai_src_len)
		ret = copy_sa(&rai->ai_src_addr, &rai->ai_src_len, hints->ai_src_addr, hints->ai_src_len);
	if (ret) {
		rdma_freeaddrinfo(rai);
		return ret;
	}
	*res = rai;
	return 0;
}
