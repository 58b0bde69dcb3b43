/* The emulated NIC: per-process thread, shared-memory fabric, WQE execution,
 * responder, CQE generation.  Everything the NIC learns about work comes from
 * mlx5 bytes: doorbells in UAR pages, WQEs in send-queue rings, receive WQEs
 * in receive rings, doorbell records; everything it reports is an mlx5 CQE.
 * Layouts: sigmatrace/mlx5.h (reference /work/shared/reference/mlx5.md). */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "emu_internal.h"

EXPORT int emu_debug;

static struct emu_nic *g_nic;
static pthread_mutex_t g_nic_lock = PTHREAD_MUTEX_INITIALIZER;

uint64_t emu_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static long futex(volatile uint32_t *addr, int op, uint32_t val, const struct timespec *ts)
{
	return syscall(SYS_futex, addr, op, val, ts, NULL, 0);
}

static void inbox_wake(struct emu_inbox_hdr *h)
{
	__atomic_add_fetch(&h->wake_seq, 1, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&h->sleeping, __ATOMIC_SEQ_CST))
		futex(&h->wake_seq, FUTEX_WAKE, 1, NULL);
}

EXPORT void emu_nic_kick(struct emu_nic *nic)
{
	if (nic && nic->inbox)
		inbox_wake(nic->inbox);
}

/* ---- configuration ------------------------------------------------------- */
static void sanitize(char *s)
{
	for (; *s; s++)
		if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' || *s == '-'))
			*s = '_';
}

static void parse_gid(const char *s, uint8_t gid[16])
{
	/* accept "fe80::1", or 32 hex digits with optional ':' separators */
	if (inet_pton(AF_INET6, s, gid) == 1)
		return;
	memset(gid, 0, 16);
	int n = 0;
	for (const char *p = s; *p && n < 32; p++) {
		int v;
		if (*p >= '0' && *p <= '9') v = *p - '0';
		else if (*p >= 'a' && *p <= 'f') v = *p - 'a' + 10;
		else if (*p >= 'A' && *p <= 'F') v = *p - 'A' + 10;
		else continue;
		gid[n / 2] |= (uint8_t)(v << ((n & 1) ? 0 : 4));
		n++;
	}
}

static void nic_config(struct emu_nic *nic)
{
	const char *e;
	emu_debug = (e = getenv("SIGMATRACE_EMU_DEBUG")) && *e && *e != '0';
	/* Busy-poll instead of sleeping when idle: for latency baselines on machines
	 * with a core to spare (a sleeping NIC thread would set the baseline). */
	nic->busy_poll = (e = getenv("SIGMATRACE_EMU_NIC_SPIN")) && *e && *e != '0';
	e = getenv("SIGMATRACE_EMU_BFREG");
	nic->bfreg_share = !e ? 0 : !strcmp(e, "page") ? 1 : !strcmp(e, "word") ? 2 : 0;
	e = getenv("SIGMATRACE_EMU_DEV_NAME");
	snprintf(nic->dev_name, sizeof nic->dev_name, "%s", e && *e ? e : "mlx5_0");
	e = getenv("SIGMATRACE_EMU_FABRIC");
	snprintf(nic->fabric, sizeof nic->fabric, "%s", e && *e ? e : "default");
	sanitize(nic->fabric);
	e = getenv("SIGMATRACE_EMU_LID");
	nic->lid = e && *e ? (uint32_t)strtoul(e, NULL, 0) : (uint32_t)(getpid() % 0xbffe) + 1;
	nic->lid &= 0xffff;
	if (!nic->lid)
		nic->lid = 1;
	e = getenv("SIGMATRACE_EMU_NODE_GUID");
	nic->guid = e && *e ? strtoull(e, NULL, 0) : (0x0002c90300000000ull | nic->lid);
	e = getenv("SIGMATRACE_EMU_GID");
	if (e && *e) {
		parse_gid(e, nic->gid);
	} else {
		memset(nic->gid, 0, 16);
		nic->gid[0] = 0xfe;
		nic->gid[1] = 0x80;
		for (int i = 0; i < 8; i++)
			nic->gid[8 + i] = (uint8_t)(nic->guid >> (56 - 8 * i));
	}
}

static void shm_name_for(const char *fabric, uint32_t lid, char *out, size_t n)
{
	snprintf(out, n, "/sigmatrace-emu.%s.%u", fabric, lid);
}

static int pid_alive(pid_t pid)
{
	if (pid <= 0)
		return 0;
	if (kill(pid, 0) < 0 && errno == ESRCH)
		return 0;
	char path[64], buf[256];
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return errno == ENOENT ? 0 : 1;
	ssize_t r = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (r <= 0)
		return 1;
	buf[r] = 0;
	char *p = strrchr(buf, ')');
	if (p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'))
		return 0;
	return 1;
}

static int inbox_create(struct emu_nic *nic)
{
	shm_name_for(nic->fabric, nic->lid, nic->shm_name, sizeof nic->shm_name);
	int fd = shm_open(nic->shm_name, O_RDWR | O_CREAT, 0600);
	if (fd < 0)
		return -1;
	size_t len = sizeof(struct emu_inbox_hdr) + EMU_RING_BYTES;
	struct stat st;
	if (fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(struct emu_inbox_hdr)) {
		struct emu_inbox_hdr *old = mmap(NULL, sizeof *old, PROT_READ, MAP_SHARED, fd, 0);
		if (old != MAP_FAILED) {
			int busy = old->magic == EMU_INBOX_MAGIC && old->pid != getpid() && pid_alive(old->pid);
			pid_t op = old->pid;
			munmap(old, sizeof *old);
			if (busy) {
				fprintf(stderr, "sigmatrace-emu: LID %u on fabric '%s' is in use by pid %d; "
					"set SIGMATRACE_EMU_LID\n", nic->lid, nic->fabric, (int)op);
				close(fd);
				return -1;
			}
		}
	}
	if (ftruncate(fd, 0) < 0 || ftruncate(fd, (off_t)len) < 0) {
		close(fd);
		return -1;
	}
	struct emu_inbox_hdr *h = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (h == MAP_FAILED)
		return -1;
	pthread_mutexattr_t a;
	pthread_mutexattr_init(&a);
	pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
	pthread_mutex_init(&h->lock, &a);
	pthread_mutexattr_destroy(&a);
	h->head = h->tail = 0;
	h->size = EMU_RING_BYTES;
	h->pid = getpid();
	h->lid = nic->lid;
	memcpy(h->gid, nic->gid, 16);
	h->guid = nic->guid;
	snprintf(h->dev_name, sizeof h->dev_name, "%s", nic->dev_name);
	__atomic_store_n(&h->magic, EMU_INBOX_MAGIC, __ATOMIC_RELEASE);
	nic->inbox = h;
	struct emu_node *self = &nic->nodes[nic->nnodes++];
	self->lid = nic->lid;
	memcpy(self->gid, nic->gid, 16);
	self->hdr = h;
	self->map_len = len;
	self->pid = getpid();
	nic->self = self;
	return 0;
}

static struct emu_node *node_open(struct emu_nic *nic, const char *name)
{
	if (nic->nnodes >= EMU_MAX_NODES)
		return NULL;
	int fd = shm_open(name, O_RDWR, 0);
	if (fd < 0)
		return NULL;
	struct stat st;
	if (fstat(fd, &st) < 0 || (size_t)st.st_size < sizeof(struct emu_inbox_hdr)) {
		close(fd);
		return NULL;
	}
	struct emu_inbox_hdr *h = mmap(NULL, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (h == MAP_FAILED)
		return NULL;
	if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != EMU_INBOX_MAGIC || !pid_alive(h->pid)) {
		munmap(h, st.st_size);
		return NULL;
	}
	struct emu_node *n = &nic->nodes[nic->nnodes++];
	memset(n, 0, sizeof *n);
	n->lid = h->lid;
	memcpy(n->gid, h->gid, 16);
	n->hdr = h;
	n->map_len = st.st_size;
	n->pid = h->pid;
	return n;
}

static struct emu_node *node_by_lid(struct emu_nic *nic, uint32_t lid)
{
	for (int i = 0; i < nic->nnodes; i++)
		if (nic->nodes[i].lid == lid && !nic->nodes[i].dead)
			return &nic->nodes[i];
	char name[160];
	shm_name_for(nic->fabric, lid, name, sizeof name);
	return node_open(nic, name);
}

static struct emu_node *node_by_gid(struct emu_nic *nic, const uint8_t gid[16])
{
	for (int i = 0; i < nic->nnodes; i++)
		if (!memcmp(nic->nodes[i].gid, gid, 16) && !nic->nodes[i].dead)
			return &nic->nodes[i];
	char prefix[128];
	snprintf(prefix, sizeof prefix, "sigmatrace-emu.%s.", nic->fabric);
	DIR *d = opendir("/dev/shm");
	if (!d)
		return NULL;
	struct dirent *de;
	struct emu_node *found = NULL;
	while (!found && (de = readdir(d))) {
		if (strncmp(de->d_name, prefix, strlen(prefix)))
			continue;
		uint32_t lid = (uint32_t)strtoul(de->d_name + strlen(prefix), NULL, 10);
		int known = 0;
		for (int i = 0; i < nic->nnodes; i++)
			if (nic->nodes[i].lid == lid && !nic->nodes[i].dead)
				known = 1;
		if (known)
			continue;
		char name[300];
		snprintf(name, sizeof name, "/%s", de->d_name);
		struct emu_node *n = node_open(nic, name);
		if (n && !memcmp(n->gid, gid, 16))
			found = n;
	}
	closedir(d);
	return found;
}

EXPORT void emu_resolve_peer(struct emu_qp *qp)
{
	struct emu_nic *nic = qp->nic;
	static const uint8_t zero[16];
	if (qp->is_global && memcmp(qp->dgid, zero, 16) && memcmp(qp->dgid, nic->gid, 16))
		qp->peer = node_by_gid(nic, qp->dgid);
	else if (qp->is_global && !memcmp(qp->dgid, nic->gid, 16))
		qp->peer = nic->self;
	else
		qp->peer = node_by_lid(nic, qp->dlid);
	EMU_LOG("qp 0x%x -> peer lid %u %s", qp->qpn, qp->dlid, qp->peer ? "found" : "NOT FOUND");
}

/* ---- inbox ring ------------------------------------------------------------ */
struct gather { const uint8_t *p; uint32_t len; };

static void gather_copy(uint8_t *dst, const struct gather *g, int ng, uint32_t off, uint32_t len)
{
	for (int i = 0; i < ng && len; i++) {
		if (off >= g[i].len) {
			off -= g[i].len;
			continue;
		}
		uint32_t n = g[i].len - off;
		if (n > len)
			n = len;
		memcpy(dst, g[i].p + off, n);
		dst += n;
		len -= n;
		off = 0;
	}
}

static int ring_lock(struct emu_inbox_hdr *h)
{
	int r = pthread_mutex_lock(&h->lock);
	if (r == EOWNERDEAD) {
		pthread_mutex_consistent(&h->lock);
		r = 0;
	}
	return r;
}

static int ring_try_push(struct emu_inbox_hdr *h, const struct emu_pkt *hdr, const uint8_t *payload)
{
	uint32_t need = (uint32_t)((sizeof(struct emu_pkt) + hdr->len + 7) & ~7u);
	if (ring_lock(h))
		return -1;
	uint64_t tail = h->tail, head = __atomic_load_n(&h->head, __ATOMIC_ACQUIRE);
	uint32_t pos = (uint32_t)(tail % h->size), contig = h->size - pos, extra = 0;
	if (contig < need)
		extra = contig;
	if (tail - head + extra + need > h->size) {
		pthread_mutex_unlock(&h->lock);
		return -1;
	}
	if (extra) {
		struct emu_pkt *pad = (struct emu_pkt *)(h->data + pos);
		pad->size = contig;
		pad->type = PKT_PAD;
		tail += contig;
		pos = 0;
	}
	struct emu_pkt *p = (struct emu_pkt *)(h->data + pos);
	memcpy(p, hdr, sizeof *hdr);
	p->size = need;
	if (hdr->len)
		memcpy(p->payload, payload, hdr->len);
	__atomic_store_n(&h->tail, tail + need, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&h->lock);
	inbox_wake(h);
	return 0;
}

static int node_flush(struct emu_node *n)
{
	int work = 0;
	while (n->outq && !n->dead) {
		struct emu_outpkt *o = n->outq;
		if (ring_try_push(n->hdr, &o->pkt, o->pkt.payload))
			break;
		n->outq = o->next;
		if (!n->outq)
			n->outq_tail = NULL;
		n->outq_bytes -= o->pkt.len + sizeof(o->pkt);
		free(o);
		work++;
	}
	return work;
}

/* Send one packet (header + payload gathered from g at off) to node n. */

/* Drop the requests still queued for a QP (destroy, error flush, reset). */
static void free_pending(struct emu_qp *qp)
{
	struct emu_pending *p = qp->pend;
	while (p) {
		struct emu_pending *n = p->next;
		free(p);
		p = n;
	}
	qp->pend = qp->pend_tail = NULL;
}
static void node_send(struct emu_node *n, struct emu_pkt *hdr, const struct gather *g, int ng, uint32_t off)
{
	if (!n || n->dead)
		return;
	if (!n->outq) {
		/* fast path: straight into the ring (gather into a temporary) */
		uint8_t stackbuf[4096] = {0};
		uint8_t *tmp = hdr->len <= sizeof stackbuf ? stackbuf : malloc(hdr->len);
		if (hdr->len)
			gather_copy(tmp, g, ng, off, hdr->len);
		int ok = ring_try_push(n->hdr, hdr, tmp) == 0;
		if (ok) {
			if (tmp != stackbuf)
				free(tmp);
			return;
		}
		struct emu_outpkt *o = malloc(sizeof *o + hdr->len);
		o->pkt = *hdr;
		memcpy(o->pkt.payload, tmp, hdr->len);
		if (tmp != stackbuf)
			free(tmp);
		o->next = NULL;
		n->outq = n->outq_tail = o;
		n->outq_bytes += hdr->len + sizeof *hdr;
		return;
	}
	struct emu_outpkt *o = malloc(sizeof *o + hdr->len);
	o->pkt = *hdr;
	if (hdr->len)
		gather_copy(o->pkt.payload, g, ng, off, hdr->len);
	o->next = NULL;
	n->outq_tail->next = o;
	n->outq_tail = o;
	n->outq_bytes += hdr->len + sizeof *hdr;
}

/* ---- object tables --------------------------------------------------------- */
EXPORT struct emu_mr *emu_mr_lookup(struct emu_nic *nic, uint32_t key)
{
	uint32_t idx = key >> 8;
	if (idx >= EMU_MAX_MR)
		return NULL;
	struct emu_mr *m = nic->mrs[idx];
	if (!m || !m->valid || m->mr.lkey != key)
		return NULL;
	return m;
}

EXPORT struct emu_qp *emu_qp_lookup(struct emu_nic *nic, uint32_t qpn)
{
	if (qpn < EMU_QPN_BASE || qpn >= EMU_QPN_BASE + EMU_MAX_QP)
		return NULL;
	return nic->qps[qpn - EMU_QPN_BASE];
}

EXPORT int emu_qp_register(struct emu_nic *nic, struct emu_qp *qp)
{
	static uint32_t rot;
	for (uint32_t k = 0; k < EMU_MAX_QP; k++) {
		uint32_t i = (rot + k) % EMU_MAX_QP;
		if (!nic->qps[i]) {
			rot = i + 1;
			nic->qps[i] = qp;
			qp->qpn = EMU_QPN_BASE + i;
			qp->nic = nic;
			nic->qlist[nic->nq++] = qp;
			qp->in_table = 1;
			return 0;
		}
	}
	return -1;
}

EXPORT void emu_qp_unregister(struct emu_nic *nic, struct emu_qp *qp)
{
	if (!qp->in_table)
		return;
	nic->qps[qp->qpn - EMU_QPN_BASE] = NULL;
	for (int i = 0; i < nic->nq; i++)
		if (nic->qlist[i] == qp) {
			nic->qlist[i] = nic->qlist[--nic->nq];
			break;
		}
	free_pending(qp);
	qp->in_table = 0;
}

EXPORT int emu_cq_register(struct emu_nic *nic, struct emu_cq *cq)
{
	for (uint32_t i = 1; i < EMU_MAX_CQ; i++)
		if (!nic->cqs[i]) {
			nic->cqs[i] = cq;
			cq->cqn = i;
			return 0;
		}
	return -1;
}

EXPORT struct emu_cq *emu_cq_lookup(struct emu_nic *nic, uint32_t cqn)
{
	return cqn < EMU_MAX_CQ ? nic->cqs[cqn] : NULL;
}

EXPORT struct emu_uar *emu_uar_alloc(struct emu_nic *nic, int devx)
{
	struct emu_uar *u = calloc(1, sizeof *u);
	if (!u)
		return NULL;
	u->page = aligned_alloc(4096, ST_MLX5_ADAPTER_PAGE_SIZE);
	if (!u->page) {
		free(u);
		return NULL;
	}
	memset(u->page, 0, ST_MLX5_ADAPTER_PAGE_SIZE);
	u->page_id = ++nic->next_uar_id;
	u->devx = devx;
	u->refs = 1;
	u->next = nic->uars;
	nic->uars = u;
	if (devx)
		nic->have_devx_uars++;
	return u;
}

EXPORT void emu_uar_free(struct emu_nic *nic, struct emu_uar *u)
{
	for (struct emu_uar **pp = &nic->uars; *pp; pp = &(*pp)->next)
		if (*pp == u) {
			*pp = u->next;
			break;
		}
	if (u->devx)
		nic->have_devx_uars--;
	free(u->page);
	free(u);
}

/* ---- CQE writing (ref §2.2) ------------------------------------------------ */
EXPORT void emu_cq_write(struct emu_cq *cq, const struct st_mlx5_cqe64 *cqe)
{
	pthread_mutex_lock(&cq->lock);
	uint32_t n = cq->ncqe;
	if (!cq->collapsed) {
		uint32_t ci = be32toh(cq->dbrec[ST_MLX5_CQ_SET_CI]) & 0xffffff;
		if (((cq->pi - ci) & 0xffffff) >= n) {
			static int warned;
			if (!warned++)
				fprintf(stderr, "sigmatrace-emu: CQ 0x%x overrun (pi %u ci %u n %u)\n", cq->cqn, cq->pi, ci, n);
		}
	}
	uint8_t *slot = cq->buf + (cq->collapsed ? 0 : (size_t)(cq->pi & (n - 1)) * 64);
	memcpy(slot, cqe, 63);
	uint8_t op_own = (uint8_t)((cqe->op_own & 0xfe) | (!!(cq->pi & n)));
	__atomic_store_n(slot + 63, op_own, __ATOMIC_RELEASE);
	cq->pi++;
	if (cq->armed) {
		uint8_t opc = op_own >> 4;
		int fire = !cq->arm_sol || (op_own & 2) || opc == ST_MLX5_CQE_REQ_ERR || opc == ST_MLX5_CQE_RESP_ERR;
		if (fire && cq->cq.channel) {
			cq->armed = 0;
			struct ibv_cq *p = &cq->cq;
			int wfd = ((struct emu_channel *)cq->cq.channel)->wfd;
			ssize_t r = write(wfd, &p, sizeof p);
			(void)r;
			cq->events++;
		}
	}
	pthread_mutex_unlock(&cq->lock);
}

static void cqe_req(struct emu_qp *qp, uint16_t wqe_idx, uint8_t opcode, uint32_t byte_len)
{
	if (!qp->scq)
		return;
	struct st_mlx5_cqe64 c;
	memset(&c, 0, sizeof c);
	c.byte_cnt = htobe32(byte_len);
	c.sop_drop_qpn = htobe32(((uint32_t)opcode << 24) | qp->qpn);
	c.wqe_counter = htobe16(wqe_idx);
	c.srqn_uidx = 0;
	c.op_own = ST_MLX5_CQE_REQ << 4;
	emu_cq_write(qp->scq, &c);
}

static void cqe_err(struct emu_cq *cq, struct emu_qp *qp, int resp, uint16_t wqe_idx, uint8_t opcode, uint8_t syndrome)
{
	if (!cq)
		return;
	struct st_mlx5_err_cqe e;
	memset(&e, 0, sizeof e);
	e.syndrome = syndrome;
	e.vendor_err_synd = syndrome == ST_MLX5_CQE_SYNDROME_WR_FLUSH_ERR ? 0xf9 : 0x81;
	e.s_wqe_opcode_qpn = htobe32(((uint32_t)opcode << 24) | qp->qpn);
	e.wqe_counter = htobe16(wqe_idx);
	e.op_own = (uint8_t)((resp ? ST_MLX5_CQE_RESP_ERR : ST_MLX5_CQE_REQ_ERR) << 4);
	emu_cq_write(cq, (struct st_mlx5_cqe64 *)&e);
}

/* ---- requester ------------------------------------------------------------ */
static struct emu_inflight *if_push(struct emu_qp *qp)
{
	if (qp->if_tail - qp->if_head >= qp->if_cap)
		return NULL;
	struct emu_inflight *f = &qp->inflight[qp->if_tail++ % qp->if_cap];
	memset(f, 0, offsetof(struct emu_inflight, sge));
	f->nsge = 0;
	return f;
}

static void flush_rq(struct emu_qp *qp);

static void drain_inflight(struct emu_qp *qp)
{
	while (qp->if_head != qp->if_tail) {
		struct emu_inflight *f = &qp->inflight[qp->if_head % qp->if_cap];
		if (!f->done)
			break;
		qp->if_head++;
		if (f->syndrome) {
			cqe_err(qp->scq, qp, 0, f->wqe_idx, f->opcode, f->syndrome);
			if (f->syndrome != ST_MLX5_CQE_SYNDROME_WR_FLUSH_ERR)
				EMU_LOG("qp 0x%x wqe %u opcode 0x%x error syndrome 0x%x", qp->qpn, f->wqe_idx, f->opcode, f->syndrome);
			if (qp->state != IBV_QPS_ERR)
				emu_qp_to_error(qp);
		} else if (f->signaled) {
			cqe_req(qp, f->wqe_idx, f->opcode, f->byte_len);
		}
	}
}

EXPORT void emu_qp_to_error(struct emu_qp *qp)
{
	qp->state = IBV_QPS_ERR;
	qp->qpx.qp_base.state = IBV_QPS_ERR;
	for (uint32_t i = qp->if_head; i != qp->if_tail; i++) {
		struct emu_inflight *f = &qp->inflight[i % qp->if_cap];
		if (!f->done) {
			f->done = 1;
			f->syndrome = ST_MLX5_CQE_SYNDROME_WR_FLUSH_ERR;
		}
	}
	drain_inflight(qp);
	free_pending(qp);
	qp->resp_active = 0;
	flush_rq(qp);
}

EXPORT void emu_qp_reset_nic_state(struct emu_qp *qp)
{
	qp->if_head = qp->if_tail = 0;
	qp->sq_exec = qp->sq_announced = 0;
	qp->rq_ci = 0;
	qp->resp_active = 0;
	qp->resp_err = 0;
	free_pending(qp);
	qp->peer = NULL;
}

/* Copy `len` bytes of the WQE that starts at WQEBB index `idx` (ring wrap aware). */
static void sq_read(struct emu_qp *qp, uint32_t idx, uint32_t off, void *dst, uint32_t len)
{
	uint32_t ring = qp->sq_wqebb * 64;
	uint32_t pos = ((idx & (qp->sq_wqebb - 1)) * 64 + off) & (ring - 1);
	uint8_t *d = dst;
	while (len) {
		uint32_t n = ring - pos;
		if (n > len)
			n = len;
		memcpy(d, qp->sq_buf + pos, n);
		d += n;
		len -= n;
		pos = 0;
	}
}

static int check_local(struct emu_nic *nic, uint32_t lkey, uint64_t addr, uint32_t len, int need_write)
{
	if (!len)
		return 0;
	struct emu_mr *m = emu_mr_lookup(nic, lkey);
	if (!m)
		return -1;
	if (addr < m->addr || addr + len > m->addr + m->len || addr + len < addr)
		return -1;
	if (need_write && !(m->access & IBV_ACCESS_LOCAL_WRITE))
		return -1;
	return 0;
}

enum { EXEC_DONE = 0, EXEC_STALL = 1 };

static int exec_wqe(struct emu_nic *nic, struct emu_qp *qp)
{
	uint32_t idx = qp->sq_exec & 0xffff;
	uint8_t w[ST_MLX5_SEND_WQE_MAX_WQEBBS * 64];
	struct st_mlx5_wqe_ctrl_seg ctrl;
	sq_read(qp, idx, 0, &ctrl, sizeof ctrl);
	uint32_t ds = st_mlx5_ctrl_ds(&ctrl);
	uint32_t opcode = st_mlx5_ctrl_opcode(&ctrl), opmod = st_mlx5_ctrl_opmod(&ctrl);
	if (ds == 0)
		ds = 1;
	uint32_t nbb = st_mlx5_wqebbs(ds);
	if (nbb > ST_MLX5_SEND_WQE_MAX_WQEBBS)
		nbb = ST_MLX5_SEND_WQE_MAX_WQEBBS, ds = nbb * 4;
	if (qp->peer && qp->peer->outq_bytes > EMU_OUTQ_LIMIT)
		return EXEC_STALL;
	if (qp->if_tail - qp->if_head >= qp->if_cap)
		return EXEC_STALL;
	sq_read(qp, idx, 0, w, ds * 16);
	int signaled = (ctrl.fm_ce_se & ST_MLX5_WQE_CTRL_CE_MASK) == ST_MLX5_WQE_CTRL_CQ_UPDATE ||
		       (ctrl.fm_ce_se & ST_MLX5_WQE_CTRL_CE_MASK) == ST_MLX5_WQE_CTRL_CQ_UPDATE_AND_EQE;
	struct emu_inflight *f = if_push(qp);
	f->wqe_idx = (uint16_t)idx;
	f->opcode = (uint8_t)opcode;
	f->signaled = (uint8_t)signaled;
	qp->sq_exec += nbb;
	EMU_LOG("qp 0x%x exec wqe %u opcode 0x%x ds %u ce %d", qp->qpn, idx, opcode, ds, signaled);

	if (qp->state == IBV_QPS_ERR) {
		f->done = 1;
		f->syndrome = ST_MLX5_CQE_SYNDROME_WR_FLUSH_ERR;
		return EXEC_DONE;
	}
#define FAIL(s) do { f->done = 1; f->syndrome = (s); return EXEC_DONE; } while (0)
	if (opcode == ST_MLX5_OPCODE_NOP) {
		f->done = 1;
		return EXEC_DONE;
	}
	if (!qp->peer || qp->peer->dead) {
		if (!qp->peer)
			emu_resolve_peer(qp);
		if (!qp->peer || qp->peer->dead)
			FAIL(ST_MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR);
	}
	uint32_t off = 16;
	struct emu_pkt h;
	memset(&h, 0, sizeof h);
	h.dst_qpn = qp->dest_qpn;
	h.src_qpn = qp->qpn;
	h.src_lid = nic->lid;
	h.seq = f->seq = qp->next_seq++;
	h.op = (uint8_t)opcode;
	const struct st_mlx5_wqe_raddr_seg *ra = NULL;
	struct gather g[EMU_MAX_SGE + 4];
	int ng = 0;
	uint64_t total = 0;

	switch (opcode) {
	case ST_MLX5_OPCODE_RDMA_WRITE:
	case ST_MLX5_OPCODE_RDMA_WRITE_IMM:
	case ST_MLX5_OPCODE_RDMA_READ:
	case ST_MLX5_OPCODE_ATOMIC_CS:
	case ST_MLX5_OPCODE_ATOMIC_FA:
		if (off + 16 > ds * 16)
			FAIL(ST_MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR);
		ra = (const struct st_mlx5_wqe_raddr_seg *)(w + off);
		off += 16;
		h.raddr = be64toh(ra->raddr);
		h.rkey = be32toh(ra->rkey);
		break;
	case ST_MLX5_OPCODE_SEND:
	case ST_MLX5_OPCODE_SEND_IMM:
	case ST_MLX5_OPCODE_SEND_INVAL:
		break;
	default:
		(void)opmod;
		FAIL(ST_MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR);
	}

	if (opcode == ST_MLX5_OPCODE_ATOMIC_CS || opcode == ST_MLX5_OPCODE_ATOMIC_FA) {
		if (off + 32 > ds * 16)
			FAIL(ST_MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR);
		const struct st_mlx5_wqe_atomic_seg *as = (const void *)(w + off);
		off += 16;
		const struct st_mlx5_wqe_data_seg *d = (const void *)(w + off);
		h.a = be64toh(as->swap_add);
		h.b = be64toh(as->compare);
		uint32_t len = be32toh(d->byte_count), lkey = be32toh(d->lkey);
		uint64_t addr = be64toh(d->addr);
		if (len < 8 || check_local(nic, lkey, addr, 8, 1))
			FAIL(ST_MLX5_CQE_SYNDROME_LOCAL_PROT_ERR);
		f->nsge = 1;
		f->sge[0].addr = addr;
		f->sge[0].len = 8;
		f->sge[0].lkey = lkey;
		h.type = PKT_ATOMIC_REQ;
		h.flags = PF_FIRST | PF_LAST;
		h.total = 8;
		node_send(qp->peer, &h, NULL, 0, 0);
		return EXEC_DONE;
	}

	if (opcode == ST_MLX5_OPCODE_RDMA_READ) {
		while (off + 16 <= ds * 16 && f->nsge < EMU_MAX_SGE) {
			const struct st_mlx5_wqe_data_seg *d = (const void *)(w + off);
			off += 16;
			uint32_t len = be32toh(d->byte_count) & 0x7fffffff, lkey = be32toh(d->lkey);
			uint64_t addr = be64toh(d->addr);
			if (check_local(nic, lkey, addr, len, 1))
				FAIL(ST_MLX5_CQE_SYNDROME_LOCAL_PROT_ERR);
			f->sge[f->nsge].addr = addr;
			f->sge[f->nsge].len = len;
			f->sge[f->nsge].lkey = lkey;
			f->nsge++;
			total += len;
		}
		h.type = PKT_READ_REQ;
		h.flags = PF_FIRST | PF_LAST;
		h.total = (uint32_t)total;
		node_send(qp->peer, &h, NULL, 0, 0);
		return EXEC_DONE;
	}

	/* SEND / WRITE: gather list from data or inline segments */
	while (off + 4 <= ds * 16 && ng < EMU_MAX_SGE + 4) {
		uint32_t bc;
		memcpy(&bc, w + off, 4);
		bc = be32toh(bc);
		if (bc & ST_MLX5_INLINE_SEG) {
			uint32_t len = bc & 0x3ff;
			if (off + 4 + len > ds * 16)
				FAIL(ST_MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR);
			g[ng].p = w + off + 4;
			g[ng].len = len;
			ng++;
			total += len;
			off += (4 + len + 15) & ~15u;
		} else {
			if (off + 16 > ds * 16)
				break;
			const struct st_mlx5_wqe_data_seg *d = (const void *)(w + off);
			off += 16;
			uint32_t len = bc, lkey = be32toh(d->lkey);
			uint64_t addr = be64toh(d->addr);
			if (check_local(nic, lkey, addr, len, 0))
				FAIL(ST_MLX5_CQE_SYNDROME_LOCAL_PROT_ERR);
			g[ng].p = (const uint8_t *)(uintptr_t)addr;
			g[ng].len = len;
			ng++;
			total += len;
		}
	}
	if (total > (1ull << 31))
		FAIL(ST_MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR);
	f->byte_len = (uint32_t)total;
	int is_send = opcode == ST_MLX5_OPCODE_SEND || opcode == ST_MLX5_OPCODE_SEND_IMM || opcode == ST_MLX5_OPCODE_SEND_INVAL;
	h.type = is_send ? PKT_SEND : PKT_WRITE;
	h.total = (uint32_t)total;
	if (opcode == ST_MLX5_OPCODE_SEND_IMM || opcode == ST_MLX5_OPCODE_RDMA_WRITE_IMM)
		h.imm = ctrl.imm;
	if (opcode == ST_MLX5_OPCODE_SEND_INVAL)
		h.imm = ctrl.imm;
	uint16_t extra = (opcode == ST_MLX5_OPCODE_SEND_IMM || opcode == ST_MLX5_OPCODE_RDMA_WRITE_IMM) ? PF_IMM :
			 opcode == ST_MLX5_OPCODE_SEND_INVAL ? PF_INV : 0;
	if (ctrl.fm_ce_se & ST_MLX5_WQE_CTRL_SOLICITED)
		extra |= 0x10; /* solicited event */
	uint64_t base_raddr = h.raddr;
	uint32_t o = 0;
	do {
		uint32_t n = (uint32_t)total - o;
		if (n > EMU_PKT_MAX)
			n = EMU_PKT_MAX;
		h.flags = (uint16_t)((o == 0 ? PF_FIRST : 0) | (o + n == total ? (PF_LAST | extra) : 0));
		h.offset = o;
		h.len = n;
		h.raddr = base_raddr + o;
		node_send(qp->peer, &h, g, ng, o);
		o += n;
	} while (o < total);
	return EXEC_DONE;
#undef FAIL
}

static struct emu_inflight *if_find(struct emu_qp *qp, uint32_t seq)
{
	for (uint32_t i = qp->if_head; i != qp->if_tail; i++) {
		struct emu_inflight *f = &qp->inflight[i % qp->if_cap];
		if (!f->done && f->seq == seq)
			return f;
	}
	return NULL;
}

static void requester_rx(struct emu_nic *nic, struct emu_qp *qp, const struct emu_pkt *p)
{
	struct emu_inflight *f = if_find(qp, p->seq);
	if (!f)
		return;
	switch (p->type) {
	case PKT_ACK:
		f->done = 1;
		break;
	case PKT_NAK:
		f->done = 1;
		f->syndrome = (uint8_t)p->syndrome;
		break;
	case PKT_READ_RESP: {
		uint32_t off = p->offset, len = p->len;
		const uint8_t *src = p->payload;
		for (uint32_t i = 0; i < f->nsge && len; i++) {
			if (off >= f->sge[i].len) {
				off -= f->sge[i].len;
				continue;
			}
			uint32_t n = f->sge[i].len - off;
			if (n > len)
				n = len;
			/* re-validate: the MR could have been deregistered meanwhile */
			if (check_local(nic, f->sge[i].lkey, f->sge[i].addr + off, n, 1)) {
				f->done = 1;
				f->syndrome = ST_MLX5_CQE_SYNDROME_LOCAL_PROT_ERR;
				drain_inflight(qp);
				return;
			}
			memcpy((uint8_t *)(uintptr_t)(f->sge[i].addr + off), src, n);
			src += n;
			len -= n;
			off = 0;
		}
		if (p->flags & PF_LAST) {
			f->done = 1;
			f->byte_len = p->total;
		}
		break;
	}
	case PKT_ATOMIC_RESP:
		if (f->nsge && !check_local(nic, f->sge[0].lkey, f->sge[0].addr, 8, 1))
			memcpy((void *)(uintptr_t)f->sge[0].addr, &p->a, 8);
		f->done = 1;
		f->byte_len = 8;
		break;
	}
	drain_inflight(qp);
}

/* ---- responder -------------------------------------------------------------- */
static void respond(struct emu_nic *nic, const struct emu_pkt *req, uint16_t type, uint32_t syndrome,
		    uint32_t my_qpn)
{
	struct emu_node *n = node_by_lid(nic, req->src_lid);
	if (!n)
		return;
	struct emu_pkt h;
	memset(&h, 0, sizeof h);
	h.type = type;
	h.dst_qpn = req->src_qpn;
	h.src_qpn = my_qpn;
	h.src_lid = nic->lid;
	h.seq = req->seq;
	h.syndrome = syndrome;
	h.flags = PF_FIRST | PF_LAST;
	node_send(n, &h, NULL, 0, 0);
}

static int check_remote(struct emu_nic *nic, struct emu_qp *qp, uint32_t rkey, uint64_t addr, uint64_t len, int access)
{
	struct emu_mr *m = emu_mr_lookup(nic, rkey);
	if (!m || !(m->access & access) || !(qp->qp_access & access))
		return -1;
	if (addr < m->addr || addr + len > m->addr + m->len || addr + len < addr)
		return -1;
	return 0;
}

/* Take the next receive WQE: returns 0 and its index, or -1 (RNR). */
static int take_recv(struct emu_qp *qp, uint32_t *wqe, int *from_srq)
{
	if (qp->srq) {
		struct emu_srq *s = qp->srq;
		uint32_t prod = be32toh(s->dbrec[0]) & 0xffff;
		if ((uint16_t)(prod - s->ci) == 0)
			return -1;
		*wqe = s->ci++;
		*from_srq = 1;
		return 0;
	}
	if (!qp->rq_wqe_cnt)
		return -1;
	uint32_t prod = be32toh(qp->dbrec[ST_MLX5_RCV_DBR]) & 0xffff;
	if ((uint16_t)(prod - qp->rq_ci) == 0)
		return -1;
	*wqe = qp->rq_ci++;
	*from_srq = 0;
	return 0;
}

/* Scatter into receive WQE; returns 0, or a syndrome. */
static int scatter_recv(struct emu_nic *nic, struct emu_qp *qp, uint32_t wqe, int from_srq,
			uint32_t off, const uint8_t *src, uint32_t len, uint32_t total)
{
	uint8_t *base;
	uint32_t stride, cnt;
	if (from_srq) {
		base = qp->srq->buf;
		stride = qp->srq->stride;
		cnt = qp->srq->wqe_cnt;
	} else {
		base = qp->rq_buf;
		stride = qp->rq_stride;
		cnt = qp->rq_wqe_cnt;
	}
	const uint8_t *wq = base + (size_t)(wqe & (cnt - 1)) * stride;
	uint64_t cap = 0;
	uint32_t nseg = stride / 16;
	for (uint32_t i = 0; i < nseg; i++) {
		const struct st_mlx5_wqe_data_seg *d = (const void *)(wq + 16 * i);
		if (be32toh(d->lkey) == ST_MLX5_INVALID_LKEY)
			break;
		cap += be32toh(d->byte_count);
	}
	if (total > cap)
		return ST_MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR;
	for (uint32_t i = 0; i < nseg && len; i++) {
		const struct st_mlx5_wqe_data_seg *d = (const void *)(wq + 16 * i);
		uint32_t lkey = be32toh(d->lkey), bl = be32toh(d->byte_count);
		if (lkey == ST_MLX5_INVALID_LKEY)
			break;
		if (off >= bl) {
			off -= bl;
			continue;
		}
		uint32_t n = bl - off;
		if (n > len)
			n = len;
		uint64_t addr = be64toh(d->addr) + off;
		if (check_local(nic, lkey, addr, n, 1))
			return ST_MLX5_CQE_SYNDROME_LOCAL_PROT_ERR;
		memcpy((void *)(uintptr_t)addr, src, n);
		src += n;
		len -= n;
		off = 0;
	}
	return 0;
}

static void cqe_resp(struct emu_qp *qp, uint8_t cqe_op, uint32_t wqe, int from_srq, const struct emu_pkt *p)
{
	struct emu_cq *cq = qp->rcq;
	if (!cq)
		return;
	struct st_mlx5_cqe64 c;
	memset(&c, 0, sizeof c);
	c.byte_cnt = htobe32(p->total);
	c.imm_inval_pkey = p->imm;
	c.sop_drop_qpn = htobe32(qp->qpn);
	c.flags_rqpn = htobe32(p->src_qpn & 0xffffff);
	c.slid = htobe16((uint16_t)p->src_lid);
	c.wqe_counter = htobe16((uint16_t)wqe);
	c.srqn_uidx = from_srq ? htobe32(qp->srq->srqn) : 0;
	c.op_own = (uint8_t)((cqe_op << 4) | ((p->flags & 0x10) ? 2 : 0));
	emu_cq_write(cq, &c);
}

/* returns 1 if the packet must wait (RNR / QP not ready) */
static int responder_rx(struct emu_nic *nic, struct emu_qp *qp, const struct emu_pkt *p)
{
	uint32_t seqtag = p->seq + 1;
	switch (p->type) {
	case PKT_SEND:
	case PKT_WRITE: {
		int is_send = p->type == PKT_SEND;
		if (qp->resp_err == seqtag)
			return 0; /* rest of a failed message */
		if (!is_send) {
			if (p->len && check_remote(nic, qp, p->rkey, p->raddr, p->len, IBV_ACCESS_REMOTE_WRITE)) {
				qp->resp_err = seqtag;
				respond(nic, p, PKT_NAK, ST_MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR, qp->qpn);
				return 0;
			}
			if ((p->flags & PF_LAST) && (p->flags & PF_IMM)) {
				uint32_t wqe;
				int srq;
				if (take_recv(qp, &wqe, &srq))
					return 1;
				if (p->len)
					memcpy((void *)(uintptr_t)p->raddr, p->payload, p->len);
				struct emu_pkt tmp = *p;
				cqe_resp(qp, ST_MLX5_CQE_RESP_WR_IMM, wqe, srq, &tmp);
				respond(nic, p, PKT_ACK, 0, qp->qpn);
				return 0;
			}
			if (p->len)
				memcpy((void *)(uintptr_t)p->raddr, p->payload, p->len);
			if (p->flags & PF_LAST)
				respond(nic, p, PKT_ACK, 0, qp->qpn);
			return 0;
		}
		if (p->flags & PF_FIRST) {
			if (take_recv(qp, &qp->resp_wqe, &qp->resp_from_srq))
				return 1;
			qp->resp_active = 1;
		} else if (!qp->resp_active) {
			return 0;
		}
		int syn = scatter_recv(nic, qp, qp->resp_wqe, qp->resp_from_srq, p->offset, p->payload, p->len, p->total);
		if (syn) {
			qp->resp_err = seqtag;
			qp->resp_active = 0;
			cqe_err(qp->rcq, qp, 1, (uint16_t)qp->resp_wqe, 0, (uint8_t)syn);
			respond(nic, p, PKT_NAK, syn == ST_MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR ?
				ST_MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR : ST_MLX5_CQE_SYNDROME_REMOTE_OP_ERR, qp->qpn);
			emu_qp_to_error(qp);
			return 0;
		}
		if (p->flags & PF_LAST) {
			qp->resp_active = 0;
			uint8_t op = (p->flags & PF_IMM) ? ST_MLX5_CQE_RESP_SEND_IMM :
				     (p->flags & PF_INV) ? ST_MLX5_CQE_RESP_SEND_INV : ST_MLX5_CQE_RESP_SEND;
			cqe_resp(qp, op, qp->resp_wqe, qp->resp_from_srq, p);
			respond(nic, p, PKT_ACK, 0, qp->qpn);
		}
		return 0;
	}
	case PKT_READ_REQ: {
		if (p->total && check_remote(nic, qp, p->rkey, p->raddr, p->total, IBV_ACCESS_REMOTE_READ)) {
			respond(nic, p, PKT_NAK, ST_MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR, qp->qpn);
			return 0;
		}
		struct emu_node *n = node_by_lid(nic, p->src_lid);
		if (!n)
			return 0;
		struct emu_pkt h;
		memset(&h, 0, sizeof h);
		h.type = PKT_READ_RESP;
		h.dst_qpn = p->src_qpn;
		h.src_qpn = qp->qpn;
		h.src_lid = nic->lid;
		h.seq = p->seq;
		h.total = p->total;
		struct gather g = { (const uint8_t *)(uintptr_t)p->raddr, p->total };
		uint32_t o = 0;
		do {
			uint32_t len = p->total - o;
			if (len > EMU_PKT_MAX)
				len = EMU_PKT_MAX;
			h.offset = o;
			h.len = len;
			h.flags = (uint16_t)((o == 0 ? PF_FIRST : 0) | (o + len == p->total ? PF_LAST : 0));
			node_send(n, &h, &g, 1, o);
			o += len;
		} while (o < p->total);
		return 0;
	}
	case PKT_ATOMIC_REQ: {
		if ((p->raddr & 7) || check_remote(nic, qp, p->rkey, p->raddr, 8, IBV_ACCESS_REMOTE_ATOMIC)) {
			respond(nic, p, PKT_NAK, (p->raddr & 7) ? ST_MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR :
				ST_MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR, qp->qpn);
			return 0;
		}
		uint64_t *t = (uint64_t *)(uintptr_t)p->raddr, orig;
		if (p->op == ST_MLX5_OPCODE_ATOMIC_FA) {
			orig = __atomic_fetch_add(t, p->a, __ATOMIC_SEQ_CST);
		} else {
			orig = p->b;
			__atomic_compare_exchange_n(t, &orig, p->a, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
		}
		struct emu_node *n = node_by_lid(nic, p->src_lid);
		struct emu_pkt h;
		memset(&h, 0, sizeof h);
		h.type = PKT_ATOMIC_RESP;
		h.dst_qpn = p->src_qpn;
		h.src_qpn = qp->qpn;
		h.src_lid = nic->lid;
		h.seq = p->seq;
		h.a = orig;
		h.flags = PF_FIRST | PF_LAST;
		node_send(n, &h, NULL, 0, 0);
		return 0;
	}
	}
	return 0;
}

static void park(struct emu_qp *qp, const struct emu_pkt *p)
{
	struct emu_pending *e = malloc(sizeof *e + p->len);
	memcpy(&e->pkt, p, sizeof *p + p->len);
	e->next = NULL;
	if (!qp->pend) {
		qp->pend = e;
		qp->pend_since_ns = emu_now_ns();
	} else {
		qp->pend_tail->next = e;
	}
	qp->pend_tail = e;
}

static int qp_accepts(struct emu_qp *qp)
{
	return qp->state == IBV_QPS_RTR || qp->state == IBV_QPS_RTS || qp->state == IBV_QPS_SQD;
}

static void inbox_dispatch(struct emu_nic *nic, const struct emu_pkt *p)
{
	struct emu_qp *qp = emu_qp_lookup(nic, p->dst_qpn);
	int is_resp = p->type >= PKT_ACK;
	if (is_resp) {
		if (qp && qp->state != IBV_QPS_RESET)
			requester_rx(nic, qp, p);
		return;
	}
	if (!qp || qp->state == IBV_QPS_ERR || qp->state == IBV_QPS_RESET) {
		/* a real fabric drops these and the requester times out: report the
		 * timeout outcome at once */
		if (p->flags & PF_LAST || p->type == PKT_READ_REQ || p->type == PKT_ATOMIC_REQ)
			respond(nic, p, PKT_NAK, ST_MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR, p->dst_qpn);
		return;
	}
	if (qp->pend || !qp_accepts(qp)) {
		park(qp, p);
		return;
	}
	if (responder_rx(nic, qp, p))
		park(qp, p);
}

static int service_pending(struct emu_nic *nic, struct emu_qp *qp)
{
	int work = 0;
	if (!qp->pend)
		return 0;
	if (!qp_accepts(qp)) {
		if (emu_now_ns() - qp->pend_since_ns > 2000000000ull) {
			while (qp->pend) {
				struct emu_pending *e = qp->pend;
				qp->pend = e->next;
				if (e->pkt.flags & PF_LAST || e->pkt.type != PKT_SEND)
					respond(nic, &e->pkt, PKT_NAK, ST_MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR, qp->qpn);
				free(e);
			}
			qp->pend_tail = NULL;
		}
		return 0;
	}
	while (qp->pend) {
		struct emu_pending *e = qp->pend;
		if (responder_rx(nic, qp, &e->pkt))
			break;
		qp->pend = e->next;
		if (!qp->pend)
			qp->pend_tail = NULL;
		free(e);
		qp->pend_since_ns = emu_now_ns();
		work++;
	}
	return work;
}

static int service_inbox(struct emu_nic *nic)
{
	struct emu_inbox_hdr *h = nic->inbox;
	int work = 0;
	uint64_t head = h->head;
	while (work < 512) {
		uint64_t tail = __atomic_load_n(&h->tail, __ATOMIC_ACQUIRE);
		if (head == tail)
			break;
		struct emu_pkt *p = (struct emu_pkt *)(h->data + head % h->size);
		uint32_t sz = p->size;
		if (p->type != PKT_PAD)
			inbox_dispatch(nic, p);
		head += sz;
		__atomic_store_n(&h->head, head, __ATOMIC_RELEASE);
		work++;
	}
	return work;
}

static void flush_rq(struct emu_qp *qp)
{
	if (qp->srq || !qp->rq_wqe_cnt || !qp->dbrec)
		return;
	uint32_t prod = be32toh(qp->dbrec[ST_MLX5_RCV_DBR]) & 0xffff;
	while ((uint16_t)(prod - qp->rq_ci) != 0) {
		cqe_err(qp->rcq, qp, 1, (uint16_t)qp->rq_ci, 0, ST_MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
		qp->rq_ci++;
	}
}

/* ---- doorbells (ref §3) ---------------------------------------------------- */
/* A UAR page shared by several QPs is sampled, not trapped: when two QPs ring
 * the same register between two samples only the last doorbell is seen.  The
 * other QPs on that page then catch up from their doorbell records (DBR+4 =
 * BE32(pi & 0xffff), ref §3.1), as a NIC's doorbell recovery would. */
static int dbr_recovery(struct emu_nic *nic, struct emu_uar *u, struct emu_qp *rung)
{
	int work = 0;
	for (int i = 0; i < nic->nq; i++) {
		struct emu_qp *q = nic->qlist[i];
		if (q == rung || q->uar != u->page || !q->dbrec || q->state != IBV_QPS_RTS)
			continue;
		uint16_t pi = (uint16_t)(be32toh(q->dbrec[ST_MLX5_SND_DBR]) & 0xffff);
		uint16_t ahead = (uint16_t)(pi - (uint16_t)q->sq_announced);
		if (ahead && ahead <= q->sq_wqebb && (uint16_t)(pi - (q->sq_exec & 0xffff)) <= q->sq_wqebb) {
			q->sq_announced = pi;
			work++;
		}
	}
	return work;
}

static int scan_uars(struct emu_nic *nic)
{
	int work = 0;
	for (struct emu_uar *u = nic->uars; u; u = u->next) {
		int nreg = u->devx ? 4 : 1;
		for (int r = 0; r < nreg; r++) {
			uint64_t v = __atomic_load_n((uint64_t *)(u->page + ST_MLX5_BF_OFFSET + 0x100 * r), __ATOMIC_ACQUIRE);
			if (v == u->last[r])
				continue;
			u->last[r] = v;
			uint8_t b[8];
			memcpy(b, &v, 8);
			struct st_mlx5_db db = st_mlx5_decode_db(b);
			struct emu_qp *qp = emu_qp_lookup(nic, db.qpn);
			EMU_LOG("doorbell uar %u reg %d: qpn 0x%x idx %u ds %u -> pi %u", u->page_id, r, db.qpn,
				db.wqe_index, db.ds, db.next_pi);
			if (!qp || qp->state == IBV_QPS_RESET || qp->state == IBV_QPS_INIT || qp->state == IBV_QPS_RTR) {
				EMU_LOG("doorbell for qpn 0x%x ignored (no such QP or not RTS)", db.qpn);
				continue;
			}
			/* accept only a producer index that moves forward by at most the ring size */
			if ((uint16_t)(db.next_pi - (qp->sq_exec & 0xffff)) <= qp->sq_wqebb)
				qp->sq_announced = db.next_pi;
			work++;
			if (u->devx)
				work += dbr_recovery(nic, u, qp);
		}
	}
	return work;
}

static int service_qps(struct emu_nic *nic)
{
	int work = 0;
	for (int i = 0; i < nic->nq; i++) {
		struct emu_qp *qp = nic->qlist[i];
		while ((uint16_t)(qp->sq_announced - qp->sq_exec) != 0 && qp->sq_buf) {
			if (exec_wqe(nic, qp) == EXEC_STALL)
				break;
			work++;
		}
		drain_inflight(qp);
		work += service_pending(nic, qp);
		if (qp->state == IBV_QPS_ERR)
			flush_rq(qp);
	}
	return work;
}

static void liveness(struct emu_nic *nic)
{
	for (int i = 0; i < nic->nnodes; i++) {
		struct emu_node *n = &nic->nodes[i];
		if (n == nic->self || n->dead)
			continue;
		if (pid_alive(n->pid) && n->hdr->pid == n->pid)
			continue;
		EMU_LOG("peer lid %u (pid %d) is gone", n->lid, (int)n->pid);
		n->dead = 1;
		while (n->outq) {
			struct emu_outpkt *o = n->outq;
			n->outq = o->next;
			free(o);
		}
		n->outq_tail = NULL;
		n->outq_bytes = 0;
		for (int q = 0; q < nic->nq; q++) {
			struct emu_qp *qp = nic->qlist[q];
			if (qp->peer != n || qp->state == IBV_QPS_ERR || qp->state == IBV_QPS_RESET)
				continue;
			/* the transport would exhaust its retries: first outstanding WR
			 * completes with RETRY_EXC, the QP enters ERR, the rest flush */
			for (uint32_t k = qp->if_head; k != qp->if_tail; k++) {
				struct emu_inflight *f = &qp->inflight[k % qp->if_cap];
				if (!f->done) {
					f->done = 1;
					f->syndrome = ST_MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR;
					break;
				}
			}
			drain_inflight(qp);
			if (qp->state != IBV_QPS_ERR)
				emu_qp_to_error(qp);
		}
		munmap(n->hdr, n->map_len);
		n->hdr = NULL;
	}
	/* QPs connected to a node that never appeared */
	for (int q = 0; q < nic->nq; q++) {
		struct emu_qp *qp = nic->qlist[q];
		if (!qp->peer && (qp->state == IBV_QPS_RTR || qp->state == IBV_QPS_RTS))
			emu_resolve_peer(qp);
	}
}

static int work_pending(struct emu_nic *nic)
{
	if (nic->inbox->head != __atomic_load_n(&nic->inbox->tail, __ATOMIC_ACQUIRE))
		return 1;
	for (struct emu_uar *u = nic->uars; u; u = u->next) {
		int nreg = u->devx ? 4 : 1;
		for (int r = 0; r < nreg; r++)
			if (__atomic_load_n((uint64_t *)(u->page + ST_MLX5_BF_OFFSET + 0x100 * r), __ATOMIC_ACQUIRE) != u->last[r])
				return 1;
	}
	return 0;
}

static int has_backlog(struct emu_nic *nic)
{
	for (int i = 0; i < nic->nnodes; i++)
		if (nic->nodes[i].outq)
			return 1;
	for (int i = 0; i < nic->nq; i++)
		if (nic->qlist[i]->pend || (uint16_t)(nic->qlist[i]->sq_announced - nic->qlist[i]->sq_exec))
			return 1;
	return 0;
}

static void *nic_main(void *arg)
{
	struct emu_nic *nic = arg;
	unsigned idle = 0;
	uint64_t backoff_us = 20;
	while (__atomic_load_n(&nic->running, __ATOMIC_ACQUIRE)) {
		int work = 0;
		pthread_mutex_lock(&nic->lock);
		work += scan_uars(nic);
		work += service_inbox(nic);
		work += service_qps(nic);
		for (int i = 0; i < nic->nnodes; i++)
			work += node_flush(&nic->nodes[i]);
		uint64_t now = emu_now_ns();
		if (now - nic->last_liveness_ns > 50000000ull) {
			nic->last_liveness_ns = now;
			liveness(nic);
		}
		int backlog = has_backlog(nic);
		pthread_mutex_unlock(&nic->lock);
		if (work) {
			idle = 0;
			backoff_us = 20;
			continue;
		}
		if (nic->busy_poll) {
#if defined(__x86_64__) || defined(__i386__)
			__builtin_ia32_pause();
#endif
			continue;
		}
		if (++idle < 64) {
			sched_yield();
			continue;
		}
		/* sleep until kicked; poll (devx UARs have no kick) with back-off */
		uint32_t seq = __atomic_load_n(&nic->inbox->wake_seq, __ATOMIC_SEQ_CST);
		__atomic_store_n(&nic->inbox->sleeping, 1, __ATOMIC_SEQ_CST);
		pthread_mutex_lock(&nic->lock); /* the UAR list changes as QPs and UARs come and go */
		int pending = work_pending(nic);
		pthread_mutex_unlock(&nic->lock);
		if (!pending) {
			uint64_t us;
			if (backlog)
				us = 200;
			else if (nic->have_devx_uars)
				us = backoff_us;
			else
				us = 50000;
			struct timespec ts = { (time_t)(us / 1000000), (long)(us % 1000000) * 1000 };
			futex(&nic->inbox->wake_seq, FUTEX_WAIT, seq, &ts);
			if (backoff_us < 2000)
				backoff_us *= 2;
		}
		__atomic_store_n(&nic->inbox->sleeping, 0, __ATOMIC_SEQ_CST);
		idle = 32; /* a short spin after waking */
	}
	return NULL;
}

static void emu_atexit(void)
{
	if (g_nic && g_nic->shm_name[0])
		shm_unlink(g_nic->shm_name);
}

EXPORT struct emu_nic *emu_nic_get(void)
{
	pthread_mutex_lock(&g_nic_lock);
	if (g_nic) {
		g_nic->refcnt++;
		pthread_mutex_unlock(&g_nic_lock);
		return g_nic;
	}
	struct emu_nic *nic = calloc(1, sizeof *nic);
	if (!nic) {
		pthread_mutex_unlock(&g_nic_lock);
		return NULL;
	}
	pthread_mutexattr_t a;
	pthread_mutexattr_init(&a);
	pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
	pthread_mutex_init(&nic->lock, &a);
	nic_config(nic);
	if (inbox_create(nic)) {
		free(nic);
		pthread_mutex_unlock(&g_nic_lock);
		return NULL;
	}
	nic->running = 1;
	nic->refcnt = 1;
	nic->next_pdn = 1;
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_create(&nic->thread, NULL, nic_main, nic);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	static int atexit_done;
	if (!atexit_done++)
		atexit(emu_atexit);
	g_nic = nic;
	EMU_LOG("NIC up: dev %s lid %u guid 0x%016llx fabric %s", nic->dev_name, nic->lid,
		(unsigned long long)nic->guid, nic->fabric);
	pthread_mutex_unlock(&g_nic_lock);
	return nic;
}

EXPORT void emu_nic_put(struct emu_nic *nic)
{
	pthread_mutex_lock(&g_nic_lock);
	if (--nic->refcnt > 0) {
		pthread_mutex_unlock(&g_nic_lock);
		return;
	}
	__atomic_store_n(&nic->running, 0, __ATOMIC_RELEASE);
	emu_nic_kick(nic);
	pthread_join(nic->thread, NULL);
	/* deliver what is still queued for peers (bounded) */
	for (int tries = 0; tries < 100; tries++) {
		int left = 0;
		for (int i = 0; i < nic->nnodes; i++) {
			node_flush(&nic->nodes[i]);
			left |= nic->nodes[i].outq != NULL;
		}
		if (!left)
			break;
		usleep(1000);
	}
	shm_unlink(nic->shm_name);
	nic->shm_name[0] = 0;
	g_nic = NULL;
	pthread_mutex_unlock(&g_nic_lock);
	/* the struct and mappings are left for late readers (process exit frees them) */
}

/* Snapshot of the identity, used by query_* without starting anything. */
EXPORT void emu_identity(char *name, size_t n, uint64_t *guid, uint32_t *lid, uint8_t gid[16])
{
	static struct emu_nic *cfg;
	struct emu_nic *src = g_nic;
	if (!src) {
		if (!cfg) {
			cfg = calloc(1, sizeof *cfg);
			if (!cfg)
				return;
			nic_config(cfg);
		}
		src = cfg;
	}
	if (name)
		snprintf(name, n, "%s", src->dev_name);
	if (guid)
		*guid = src->guid;
	if (lid)
		*lid = src->lid;
	if (gid)
		memcpy(gid, src->gid, 16);
}
