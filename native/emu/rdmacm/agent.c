/* Emulated librdmacm: the per-process CM agent.
 *
 * Created by the first rdma_cm call (cma_init).  It opens the emulated device
 * once (what real librdmacm keeps open for the process lifetime), publishes
 * the node in a registry file /dev/shm/sigmatrace-emu.<fabric>.cm<LID> (pid,
 * LID, GID, owned addresses), listens on the abstract unix seqpacket socket
 * "sigmatrace-emu-cm.<fabric>.<LID>", and runs a thread that accepts
 * connections, reads CM messages (conn.c handles them), notices peers whose
 * sockets closed, and fires timers (resolution and handshake timeouts). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>

#include <arpa/inet.h>

#include "cma.h"

struct cma_global cma = { .lock = PTHREAD_MUTEX_INITIALIZER, .lsock = -1, .wakefd = -1 };
int cma_debug;
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;

uint64_t cma_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void cma_wake_agent(void)
{
	uint64_t one = 1;
	if (cma.wakefd >= 0 && write(cma.wakefd, &one, sizeof one) < 0) {
		/* the counter is saturated: the agent is awake anyway */
	}
}

void cma_set_timer_us(struct cm_id *c, int kind, long us, int status)
{
	c->timer = kind;
	c->timer_status = status;
	c->deadline_ns = cma_now_ns() + (uint64_t)(us > 0 ? us : 0) * 1000ull;
	cma_wake_agent();
}

void cma_set_timer(struct cm_id *c, int kind, int ms, int status)
{
	cma_set_timer_us(c, kind, (long)ms * 1000, status);
}

/* The fabric name as nic.c reads it (same default and character set). */
static void read_fabric(char *out, size_t n)
{
	const char *e = getenv("SIGMATRACE_EMU_FABRIC");
	snprintf(out, n, "%s", e && *e ? e : "default");
	for (char *s = out; *s; s++)
		if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' ||
		      *s == '-'))
			*s = '_';
}

static socklen_t agent_sockaddr(uint32_t lid, struct sockaddr_un *sa)
{
	memset(sa, 0, sizeof *sa);
	sa->sun_family = AF_UNIX;
	int n = snprintf(sa->sun_path + 1, sizeof sa->sun_path - 1, "sigmatrace-emu-cm.%s.%u", cma.fabric, lid);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

static void registry_path(uint32_t lid, char *out, size_t n)
{
	snprintf(out, n, "/dev/shm/sigmatrace-emu.%s.cm%u", cma.fabric, lid);
}

/* ---- registry ---------------------------------------------------------------- */
static int pid_alive(int pid)
{
	if (pid <= 0)
		return 0;
	if (kill(pid, 0) < 0 && errno == ESRCH)
		return 0;
	char path[64], buf[256];
	snprintf(path, sizeof path, "/proc/%d/stat", pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : 1;
	ssize_t r = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (r <= 0)
		return 1;
	buf[r] = 0;
	char *p = strrchr(buf, ')');
	return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
}

struct reg_entry {
	struct cm_node node;
	struct sockaddr_storage addrs[16];
	int naddrs;
};

static int registry_read(const char *path, struct reg_entry *r)
{
	FILE *f = fopen(path, "re");
	if (!f)
		return -1;
	char line[256];
	int ok = 0;
	memset(r, 0, sizeof *r);
	while (fgets(line, sizeof line, f)) {
		char key[32], val[200];
		if (sscanf(line, "%31s %199s", key, val) != 2)
			continue;
		if (!strcmp(key, "sigmatrace-emu-cm"))
			ok = 1;
		else if (!strcmp(key, "pid"))
			r->node.pid = atoi(val);
		else if (!strcmp(key, "lid"))
			r->node.lid = (uint32_t)strtoul(val, NULL, 0);
		else if (!strcmp(key, "gid"))
			inet_pton(AF_INET6, val, r->node.gid);
		else if (!strcmp(key, "addr") && r->naddrs < 16) {
			struct sockaddr_storage *ss = &r->addrs[r->naddrs];
			memset(ss, 0, sizeof *ss);
			if (inet_pton(AF_INET, val, &((struct sockaddr_in *)ss)->sin_addr) == 1)
				ss->ss_family = AF_INET;
			else if (inet_pton(AF_INET6, val, &((struct sockaddr_in6 *)ss)->sin6_addr) == 1)
				ss->ss_family = AF_INET6;
			else
				continue;
			r->naddrs++;
		}
	}
	fclose(f);
	return ok && r->node.lid && pid_alive(r->node.pid) ? 0 : -1;
}

static int registry_write(void)
{
	char tmp[300];
	registry_path(cma.lid, cma.reg_path, sizeof cma.reg_path);
	snprintf(tmp, sizeof tmp, "/dev/shm/sigmatrace-emu.%s.cmtmp%d", cma.fabric, (int)getpid());
	FILE *f = fopen(tmp, "we");
	if (!f)
		return -1;
	char g[INET6_ADDRSTRLEN], a[INET6_ADDRSTRLEN];
	inet_ntop(AF_INET6, cma.gid, g, sizeof g);
	fprintf(f, "sigmatrace-emu-cm 1\npid %d\nlid %u\ngid %s\nguid 0x%016llx\n", (int)getpid(), cma.lid, g,
		(unsigned long long)cma.guid);
	struct sockaddr_in lo;
	cma_loopback_of(cma.lid, &lo);
	fprintf(f, "addr %s\n", inet_ntop(AF_INET, &lo.sin_addr, a, sizeof a));
	for (int i = 0; i < cma.naddrs; i++) {
		const struct sockaddr_storage *ss = &cma.addrs[i];
		const void *p = ss->ss_family == AF_INET ? (const void *)&((const struct sockaddr_in *)ss)->sin_addr
							 : (const void *)&((const struct sockaddr_in6 *)ss)->sin6_addr;
		fprintf(f, "addr %s\n", inet_ntop(ss->ss_family, p, a, sizeof a));
	}
	if (fclose(f) || rename(tmp, cma.reg_path)) {
		unlink(tmp);
		return -1;
	}
	return 0;
}

static int entry_owns(const struct reg_entry *r, const struct sockaddr *a)
{
	if (a->sa_family == AF_IB)
		return !memcmp(((const struct sockaddr_ib *)a)->sib_addr.sib_raw, r->node.gid, 16);
	for (int i = 0; i < r->naddrs; i++)
		if (cma_addr_equal(a, (const struct sockaddr *)&r->addrs[i]))
			return 1;
	return 0;
}

int cma_node_lookup(const struct sockaddr *a, struct cm_node *out)
{
	if (cma_addr_owned(a)) {
		out->lid = cma.lid;
		memcpy(out->gid, cma.gid, 16);
		out->pid = (int)getpid();
		return 0;
	}
	struct reg_entry r;
	char path[300];
	if (a->sa_family == AF_INET && cma_addr_is_loopback(a)) {
		/* 127.0.<hi>.<lo> is node hi*256+lo, nothing else on 127/8 is anybody's */
		uint32_t ip = ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr);
		if ((ip >> 16) != 0x7f00 || !(ip & 0xffff))
			return -1;
		registry_path(ip & 0xffff, path, sizeof path);
		if (registry_read(path, &r) || !entry_owns(&r, a))
			return -1;
		*out = r.node;
		return 0;
	}
	char prefix[128];
	int plen = snprintf(prefix, sizeof prefix, "sigmatrace-emu.%s.cm", cma.fabric);
	DIR *d = opendir("/dev/shm");
	if (!d)
		return -1;
	struct dirent *de;
	int found = -1;
	while (found && (de = readdir(d))) {
		if (strncmp(de->d_name, prefix, (size_t)plen) || de->d_name[plen] < '0' || de->d_name[plen] > '9')
			continue;
		snprintf(path, sizeof path, "/dev/shm/%s", de->d_name);
		if (registry_read(path, &r) == 0 && entry_owns(&r, a)) {
			*out = r.node;
			found = 0;
		}
	}
	closedir(d);
	return found;
}

/* ---- sockets ------------------------------------------------------------------- */
int cma_agent_connect(uint32_t lid)
{
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -1;
	struct sockaddr_un sa;
	socklen_t len = agent_sockaddr(lid, &sa);
	for (int tries = 0;; tries++) {
		if (connect(fd, (struct sockaddr *)&sa, len) == 0)
			return fd;
		if (errno != EAGAIN || tries > 200)
			break;
		usleep(1000);   /* the peer's backlog is full: it is accepting */
	}
	int e = errno;
	close(fd);
	errno = e;
	return -1;
}

void cma_msg_init(struct cmw_msg *m, int type)
{
	memset(m, 0, sizeof *m);
	m->magic = CMW_MAGIC;
	m->type = (uint16_t)type;
	m->lid = cma.lid;
	memcpy(m->gid, cma.gid, 16);
}

int cma_send(int fd, struct cmw_msg *m)
{
	static const char *names[] = { "?", "REQ", "REP", "RTU", "REJ", "DREQ", "DREP", "SIDR_REQ", "SIDR_REP" };
	CMA_LOG("send %s on fd %d (qpn 0x%x status %u pdata %u)", m->type < 9 ? names[m->type] : "?", fd, m->qpn,
		m->status, m->pdlen);
	if (fd < 0)
		return -1;
	ssize_t r = send(fd, m, sizeof *m, MSG_NOSIGNAL | MSG_DONTWAIT);
	return r == (ssize_t)sizeof *m ? 0 : -1;
}

/* ---- the agent thread ------------------------------------------------------------ */
static void accept_all(void)
{
	for (;;) {
		int fd = accept4(cma.lsock, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0)
			return;
		struct cm_pending_sock *p = calloc(1, sizeof *p);
		if (!p) {
			close(fd);
			continue;
		}
		p->fd = fd;
		p->next = cma.pending;
		cma.pending = p;
	}
}

static int fd_known(int fd)
{
	for (struct cm_pending_sock *p = cma.pending; p; p = p->next)
		if (p->fd == fd)
			return 1;
	for (struct cm_id *c = cma.ids; c; c = c->next)
		if (c->sock == fd)
			return 1;
	return 0;
}

static void read_socket(int fd)
{
	struct cmw_msg m;
	while (fd_known(fd)) {
		ssize_t r = recv(fd, &m, sizeof m, MSG_DONTWAIT);
		if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
			cma_handle_eof(fd);
			return;
		}
		if (r < 0)
			return;
		if (r != (ssize_t)sizeof m || m.magic != CMW_MAGIC) {
			CMA_LOG("fd %d: malformed CM message (%zd bytes) ignored", fd, r);
			continue;
		}
		cma_handle_msg(fd, &m);
	}
}

static int run_timers(void)
{
	uint64_t now = cma_now_ns(), next = UINT64_MAX;
	int again;
	do {
		again = 0;
		for (struct cm_id *c = cma.ids; c; c = c->next) {
			if (c->timer == CT_NONE)
				continue;
			if (c->deadline_ns <= now) {
				cma_timer_fired(c);  /* may free ids: start over */
				again = 1;
				break;
			}
			if (c->deadline_ns < next)
				next = c->deadline_ns;
		}
	} while (again);
	if (next == UINT64_MAX)
		return 1000;
	uint64_t ms = (next - now + 999999) / 1000000;   /* poll()'s resolution: at most 1 ms late */
	return ms > 1000 ? 1000 : (int)ms;
}

static void *agent_main(void *arg)
{
	(void)arg;
	struct pollfd *pf = NULL;
	size_t cap = 0;
	for (;;) {
		pthread_mutex_lock(&cma.lock);
		int timeout = run_timers();
		size_t n = 2;
		for (struct cm_pending_sock *p = cma.pending; p; p = p->next)
			n++;
		for (struct cm_id *c = cma.ids; c; c = c->next)
			n += c->sock >= 0;
		if (n > cap) {
			struct pollfd *np = realloc(pf, n * 2 * sizeof *pf);
			if (!np) {   /* keep the old set; retry soon */
				pthread_mutex_unlock(&cma.lock);
				usleep(10000);
				continue;
			}
			pf = np;
			cap = n * 2;
		}
		size_t k = 0;
		pf[k++] = (struct pollfd){ .fd = cma.wakefd, .events = POLLIN };
		pf[k++] = (struct pollfd){ .fd = cma.lsock, .events = POLLIN };
		for (struct cm_pending_sock *p = cma.pending; p; p = p->next)
			pf[k++] = (struct pollfd){ .fd = p->fd, .events = POLLIN };
		for (struct cm_id *c = cma.ids; c; c = c->next)
			if (c->sock >= 0)
				pf[k++] = (struct pollfd){ .fd = c->sock, .events = POLLIN };
		pthread_mutex_unlock(&cma.lock);

		int r = poll(pf, k, timeout);
		if (r < 0 && errno != EINTR)
			usleep(1000);
		pthread_mutex_lock(&cma.lock);
		if (pf[0].revents & POLLIN) {
			uint64_t v;
			if (read(cma.wakefd, &v, sizeof v) < 0) {
				/* nothing to drain */
			}
		}
		if (pf[1].revents & POLLIN)
			accept_all();
		for (size_t i = 2; i < k; i++)
			if (pf[i].revents & (POLLIN | POLLHUP | POLLERR))
				read_socket(pf[i].fd);
		pthread_mutex_unlock(&cma.lock);
	}
	return NULL;
}

static void cma_atexit(void)
{
	if (cma.reg_path[0])
		unlink(cma.reg_path);
}

/* ---- initialisation ---------------------------------------------------------------- */
static int do_init(void)
{
	const char *e = getenv("SIGMATRACE_EMU_DEBUG");
	cma_debug = e && *e && *e != '0';
	e = getenv("SIGMATRACE_EMU_CM_TIMEOUT_MS");
	cma.cm_timeout_ms = e && *e ? atoi(e) : 8000;
	if (cma.cm_timeout_ms <= 0)
		cma.cm_timeout_ms = 8000;
	e = getenv("SIGMATRACE_EMU_CM_SA_DELAY_US");
	cma.sa_delay_us = e && *e ? atol(e) : 5000;
	if (cma.sa_delay_us < 0)
		cma.sa_delay_us = 0;
	read_fabric(cma.fabric, sizeof cma.fabric);
	cma_parse_addr_list(getenv("SIGMATRACE_EMU_IP_ADDRS"));
	srandom((unsigned)(getpid() ^ cma_now_ns()));

	int n = 0;
	cma.devs = ibv_get_device_list(&n);
	if (!cma.devs || n < 1) {
		fprintf(stderr, "librdmacm: Fatal: no RDMA devices found\n");
		return ENODEV;
	}
	cma.ctx = ibv_open_device(cma.devs[0]);
	if (!cma.ctx)
		return ENODEV;
	cma.pd = ibv_alloc_pd(cma.ctx);
	struct ibv_port_attr pa;
	union ibv_gid gid;
	if (!cma.pd || ibv_query_port(cma.ctx, 1, &pa) || ibv_query_gid(cma.ctx, 1, 0, &gid))
		return ENODEV;
	cma.lid = pa.lid;
	memcpy(cma.gid, gid.raw, 16);
	cma.guid = be64toh(ibv_get_device_guid(cma.devs[0]));

	cma.wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	cma.lsock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (cma.wakefd < 0 || cma.lsock < 0)
		return errno;
	struct sockaddr_un sa;
	socklen_t len = agent_sockaddr(cma.lid, &sa);
	if (bind(cma.lsock, (struct sockaddr *)&sa, len) || listen(cma.lsock, SOMAXCONN)) {
		int err = errno;
		fprintf(stderr, "sigmatrace-emu: rdma_cm agent of LID %u on fabric '%s': %s; set SIGMATRACE_EMU_LID\n",
			cma.lid, cma.fabric, strerror(err));
		return err;
	}
	if (registry_write()) {
		fprintf(stderr, "sigmatrace-emu: cannot write %s: %s\n", cma.reg_path, strerror(errno));
		return errno ? errno : EIO;
	}
	atexit(cma_atexit);
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int r = pthread_create(&cma.thread, NULL, agent_main, NULL);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r)
		return r;
	pthread_detach(cma.thread);
	CMA_LOG("agent up: lid %u fabric %s, %d extra address(es)", cma.lid, cma.fabric, cma.naddrs);
	return 0;
}

int cma_init(void)
{
	pthread_mutex_lock(&init_lock);
	if (!cma.inited) {
		cma.init_errno = do_init();
		cma.inited = 1;
	}
	int e = cma.init_errno;
	pthread_mutex_unlock(&init_lock);
	return e ? cma_err(e) : 0;
}
