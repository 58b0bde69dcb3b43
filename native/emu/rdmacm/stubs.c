/* Emulated librdmacm: the RDMACM_* entry points that are not emulated.  They
 * exist so that programs linked against rdma-core's librdmacm with BIND_NOW
 * (perftest, libfabric, UCX's uct_rdmacm, librspreload) load; they fail the
 * way the real calls fail on a device without the feature.
 *   - multicast: ENOSYS (no multicast on the emulated fabric);
 *   - ECE: EOPNOTSUPP (the emulated device has none);
 *   - rsockets: ENOSYS (rsocket/riomap/... need a byte stream over RC QPs;
 *     not provided). */
#include <errno.h>
#include <poll.h>
#include <rdma/rsocket.h>
#include <stdarg.h>
#include <sys/select.h>

#include "cma.h"

CMA_EXPORT int rdma_join_multicast(struct rdma_cm_id *id, struct sockaddr *addr, void *context)
{
	return cma_err(ENOSYS);
}

CMA_EXPORT int rdma_join_multicast_ex(struct rdma_cm_id *id, struct rdma_cm_join_mc_attr_ex *mc_join_attr,
				      void *context)
{
	return cma_err(ENOSYS);
}

CMA_EXPORT int rdma_leave_multicast(struct rdma_cm_id *id, struct sockaddr *addr)
{
	return cma_err(EADDRNOTAVAIL);   /* never joined */
}

CMA_EXPORT int rdma_notify(struct rdma_cm_id *id, enum ibv_event_type event)
{
	return id ? 0 : cma_err(EINVAL);
}

CMA_EXPORT int rdma_set_local_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
	return cma_err(EOPNOTSUPP);
}

CMA_EXPORT int rdma_get_remote_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
	return cma_err(EOPNOTSUPP);
}

/* ---- rsockets ---------------------------------------------------------------------------- */
#define RS_NOSYS(ret) do { errno = ENOSYS; return (ret); } while (0)

CMA_EXPORT int rsocket(int domain, int type, int protocol) { RS_NOSYS(-1); }
CMA_EXPORT int rbind(int socket, const struct sockaddr *addr, socklen_t addrlen) { RS_NOSYS(-1); }
CMA_EXPORT int rlisten(int socket, int backlog) { RS_NOSYS(-1); }
CMA_EXPORT int raccept(int socket, struct sockaddr *addr, socklen_t *addrlen) { RS_NOSYS(-1); }
CMA_EXPORT int rconnect(int socket, const struct sockaddr *addr, socklen_t addrlen) { RS_NOSYS(-1); }
CMA_EXPORT int rshutdown(int socket, int how) { RS_NOSYS(-1); }
CMA_EXPORT int rclose(int socket) { RS_NOSYS(-1); }
CMA_EXPORT ssize_t rrecv(int socket, void *buf, size_t len, int flags) { RS_NOSYS(-1); }
CMA_EXPORT ssize_t rrecvfrom(int socket, void *buf, size_t len, int flags, struct sockaddr *src_addr,
			     socklen_t *addrlen) { RS_NOSYS(-1); }
CMA_EXPORT ssize_t rrecvmsg(int socket, struct msghdr *msg, int flags) { RS_NOSYS(-1); }
CMA_EXPORT ssize_t rsend(int socket, const void *buf, size_t len, int flags) { RS_NOSYS(-1); }
CMA_EXPORT ssize_t rsendto(int socket, const void *buf, size_t len, int flags, const struct sockaddr *dest_addr,
			   socklen_t addrlen) { RS_NOSYS(-1); }
CMA_EXPORT ssize_t rsendmsg(int socket, const struct msghdr *msg, int flags) { RS_NOSYS(-1); }
CMA_EXPORT ssize_t rread(int socket, void *buf, size_t count) { RS_NOSYS(-1); }
CMA_EXPORT ssize_t rreadv(int socket, const struct iovec *iov, int iovcnt) { RS_NOSYS(-1); }
CMA_EXPORT ssize_t rwrite(int socket, const void *buf, size_t count) { RS_NOSYS(-1); }
CMA_EXPORT ssize_t rwritev(int socket, const struct iovec *iov, int iovcnt) { RS_NOSYS(-1); }
CMA_EXPORT int rpoll(struct pollfd *fds, nfds_t nfds, int timeout) { RS_NOSYS(-1); }
CMA_EXPORT int rselect(int nfds, fd_set *readfds, fd_set *writefds, fd_set *exceptfds, struct timeval *timeout)
{
	RS_NOSYS(-1);
}
CMA_EXPORT int rgetpeername(int socket, struct sockaddr *addr, socklen_t *addrlen) { RS_NOSYS(-1); }
CMA_EXPORT int rgetsockname(int socket, struct sockaddr *addr, socklen_t *addrlen) { RS_NOSYS(-1); }
CMA_EXPORT int rsetsockopt(int socket, int level, int optname, const void *optval, socklen_t optlen)
{
	RS_NOSYS(-1);
}
CMA_EXPORT int rgetsockopt(int socket, int level, int optname, void *optval, socklen_t *optlen) { RS_NOSYS(-1); }
CMA_EXPORT int rfcntl(int socket, int cmd, ...) { RS_NOSYS(-1); }
CMA_EXPORT off_t riomap(int socket, void *buf, size_t len, int prot, int flags, off_t offset) { RS_NOSYS(-1); }
CMA_EXPORT int riounmap(int socket, void *buf, size_t len) { RS_NOSYS(-1); }
CMA_EXPORT size_t riowrite(int socket, const void *buf, size_t count, off_t offset, int flags)
{
	RS_NOSYS(0);
}
