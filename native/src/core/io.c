/*
 * Whole writes of a chunk's pieces, shared by the in-process writer (writer.c)
 * and the consumer process (consumer/consumer.c): a short writev goes on from
 * where it stopped, EINTR is retried, any other error is the caller's (the
 * chunk is then not counted as written).
 */
#include <errno.h>
#include <string.h>
#include <sys/uio.h>

#include "core.h"

int st_writev_all(int fd, const struct iovec *iov, int n)
{
	struct iovec v[ST_WRITEV_MAX];
	if (n < 0 || n > ST_WRITEV_MAX)
		return -1;
	memcpy(v, iov, sizeof(*iov) * (size_t)n);
	int i = 0;
	while (i < n) {
		ssize_t w = writev(fd, v + i, n - i);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		while (i < n && (size_t)w >= v[i].iov_len) {
			w -= (ssize_t)v[i].iov_len;
			i++;
		}
		if (i < n) {
			v[i].iov_base = (char *)v[i].iov_base + w;
			v[i].iov_len -= (size_t)w;
		}
	}
	return 0;
}
