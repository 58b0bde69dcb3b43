/* The emulated NIC's fabric: every NIC has an inbox, a shared-memory ring
 * of packets in /dev/shm/sigmatrace-emu.<fabric>.<lid>, that the NICs of
 * other processes (and its own, for loopback) write under a robust
 * process-shared mutex.  Peers are found by LID or GID, packets that do not
 * fit a peer's ring wait in an outbound queue, and a peer whose process is
 * gone fails the QPs connected to it. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "emu_internal.h"

long emu_futex(volatile uint32_t *addr, int op, uint32_t val, const struct timespec *ts)
{
	return syscall(SYS_futex, addr, op, val, ts, NULL, 0);
}

static void inbox_wake(struct emu_inbox_hdr *h)
{
	__atomic_add_fetch(&h->wake_seq, 1, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&h->sleeping, __ATOMIC_SEQ_CST))
		emu_futex(&h->wake_seq, FUTEX_WAKE, 1, NULL);
}

EXPORT void emu_nic_kick(struct emu_nic *nic)
{
	if (nic && nic->inbox)
		inbox_wake(nic->inbox);
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

int emu_inbox_create(struct emu_nic *nic)
{
	shm_name_for(nic->fabric, nic->lid, nic->shm_name, sizeof nic->shm_name);
	int fd = shm_open(nic->shm_name, O_RDWR | O_CREAT, 0600);
	if (fd < 0)
		return -1;
	size_t len = sizeof(struct emu_inbox_hdr) + EMU_RING_BYTES;
	struct stat shm_stat;
	if (fstat(fd, &shm_stat) == 0 && (size_t)shm_stat.st_size >= sizeof(struct emu_inbox_hdr)) {
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
	struct stat shm_stat;
	if (fstat(fd, &shm_stat) < 0 || (size_t)shm_stat.st_size < sizeof(struct emu_inbox_hdr)) {
		close(fd);
		return NULL;
	}
	struct emu_inbox_hdr *h = mmap(NULL, shm_stat.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (h == MAP_FAILED)
		return NULL;
	if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != EMU_INBOX_MAGIC || !pid_alive(h->pid)) {
		munmap(h, shm_stat.st_size);
		return NULL;
	}
	struct emu_node *n = &nic->nodes[nic->nnodes++];
	memset(n, 0, sizeof *n);
	n->lid = h->lid;
	memcpy(n->gid, h->gid, 16);
	n->hdr = h;
	n->map_len = shm_stat.st_size;
	n->pid = h->pid;
	return n;
}

struct emu_node *emu_node_by_lid(struct emu_nic *nic, uint32_t lid)
{
	for (int i = 0; i < nic->nnodes; i++)
		if (nic->nodes[i].lid == lid && !nic->nodes[i].dead)
			return &nic->nodes[i];
	char name[160];
	shm_name_for(nic->fabric, lid, name, sizeof name);
	return node_open(nic, name);
}

struct emu_node *emu_node_by_gid(struct emu_nic *nic, const uint8_t gid[16])
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
		qp->peer = emu_node_by_gid(nic, qp->dgid);
	else if (qp->is_global && !memcmp(qp->dgid, nic->gid, 16))
		qp->peer = nic->self;
	else
		qp->peer = emu_node_by_lid(nic, qp->dlid);
	EMU_LOG("qp 0x%x -> peer lid %u %s", qp->qpn, qp->dlid, qp->peer ? "found" : "NOT FOUND");
}

/* ---- inbox ring ------------------------------------------------------------ */
static void gather_copy(uint8_t *dst, const struct emu_gather *g, int ng, uint32_t off, uint32_t len)
{
	for (int i = 0; i < ng && len; i++) {
		if (off >= g[i].len) {
			off -= g[i].len;
			continue;
		}
		uint32_t n = g[i].len - off;
		if (n > len)
			n = len;
		emu_dma_read(dst, (uint64_t)(uintptr_t)(g[i].data + off), n); /* GPU memory through CUDA (dma.c) */
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

int emu_node_flush(struct emu_node *n)
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
void emu_node_send(struct emu_node *n, struct emu_pkt *hdr, const struct emu_gather *g, int ng, uint32_t off)
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

int emu_service_inbox(struct emu_nic *nic)
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
			emu_inbox_dispatch(nic, p);
		head += sz;
		__atomic_store_n(&h->head, head, __ATOMIC_RELEASE);
		work++;
	}
	return work;
}

void emu_liveness(struct emu_nic *nic)
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
			for (uint32_t k = qp->inflight_head; k != qp->inflight_tail; k++) {
				struct emu_inflight *f = &qp->inflight[k % qp->inflight_cap];
				if (!f->done) {
					f->done = 1;
					f->syndrome = ST_MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR;
					break;
				}
			}
			emu_drain_inflight(qp);
			if (qp->state != IBV_QPS_ERR)
				emu_qp_to_error(qp);
		}
		munmap(n->hdr, n->map_len);
		n->hdr = NULL;
	}
	/* QPs connected to a node that never appeared */
	for (int q = 0; q < nic->nq; q++) {
		struct emu_qp *qp = nic->qlist[q];
		if (!qp->peer && qp->qp_type != IBV_QPT_UD && (qp->state == IBV_QPS_RTR || qp->state == IBV_QPS_RTS))
			emu_resolve_peer(qp);
	}
}
