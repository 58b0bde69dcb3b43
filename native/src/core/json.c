/*
 * Minimal JSON writer into a caller-provided buffer.  Never allocates (it is
 * used on the fatal-signal path); output that does not fit sets `overflow`
 * and is truncated at a value boundary by the caller's choice of size.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "core.h"

void st_json_init(struct st_json *j, char *buf, size_t cap)
{
	j->buf = buf;
	j->cap = cap;
	j->len = 0;
	j->need_comma = 0;
	j->overflow = 0;
	if (cap)
		buf[0] = 0;
}

static void put(struct st_json *j, const char *s, size_t n)
{
	if (j->len + n + 1 > j->cap) {
		j->overflow = 1;
		return;
	}
	memcpy(j->buf + j->len, s, n);
	j->len += n;
	j->buf[j->len] = 0;
}

void st_json_raw(struct st_json *j, const char *s)
{
	put(j, s, strlen(s));
}

static void put_escaped(struct st_json *j, const char *s)
{
	put(j, "\"", 1);
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		char esc[8];
		if (*p == '"' || *p == '\\') {
			esc[0] = '\\';
			esc[1] = (char)*p;
			put(j, esc, 2);
		} else if (*p < 0x20) {
			snprintf(esc, sizeof(esc), "\\u%04x", *p);
			put(j, esc, 6);
		} else {
			put(j, (const char *)p, 1);
		}
	}
	put(j, "\"", 1);
}

static void key(struct st_json *j, const char *k)
{
	if (j->need_comma)
		put(j, ",", 1);
	if (k) {
		put_escaped(j, k);
		put(j, ":", 1);
	}
	j->need_comma = 1;
}

void st_json_open(struct st_json *j, const char *k, char bracket)
{
	key(j, k);
	put(j, &bracket, 1);
	j->need_comma = 0;
}

void st_json_close(struct st_json *j, char bracket)
{
	put(j, &bracket, 1);
	j->need_comma = 1;
}

void st_json_str(struct st_json *j, const char *k, const char *v)
{
	key(j, k);
	if (v)
		put_escaped(j, v);
	else
		put(j, "null", 4);
}

void st_json_int(struct st_json *j, const char *k, long long v)
{
	char b[32];
	key(j, k);
	put(j, b, (size_t)snprintf(b, sizeof(b), "%lld", v));
}

void st_json_uint(struct st_json *j, const char *k, unsigned long long v)
{
	char b[32];
	key(j, k);
	put(j, b, (size_t)snprintf(b, sizeof(b), "%llu", v));
}

void st_json_hex(struct st_json *j, const char *k, unsigned long long v)
{
	char b[32];
	key(j, k);
	put(j, b, (size_t)snprintf(b, sizeof(b), "\"%016llx\"", v));
}

void st_json_double(struct st_json *j, const char *k, double v)
{
	char b[48];
	key(j, k);
	if (v != v)
		put(j, "null", 4);
	else
		put(j, b, (size_t)snprintf(b, sizeof(b), "%.17g", v));
}

void st_json_null(struct st_json *j, const char *k)
{
	key(j, k);
	put(j, "null", 4);
}

void st_json_bool(struct st_json *j, const char *k, int v)
{
	key(j, k);
	put(j, v ? "true" : "false", v ? 4 : 5);
}

void st_json_bytes_hex(struct st_json *j, const char *k, const void *p, size_t n)
{
	static const char hx[] = "0123456789abcdef";
	key(j, k);
	put(j, "\"", 1);
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++) {
		char two[2] = {hx[b[i] >> 4], hx[b[i] & 15]};
		put(j, two, 2);
	}
	put(j, "\"", 1);
}

/* "ip:port" for inet addresses, hex bytes otherwise (libfabric addresses
 * are often provider-specific blobs). */
void st_json_sockaddr(struct st_json *j, const char *k, const void *sa, size_t len)
{
	char b[INET6_ADDRSTRLEN + 16];
	if (!sa || !len) {
		st_json_null(j, k);
		return;
	}
	const struct sockaddr *s = sa;
	if (len >= sizeof(struct sockaddr_in) && s->sa_family == AF_INET) {
		const struct sockaddr_in *in = sa;
		char ip[INET_ADDRSTRLEN];
		inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
		snprintf(b, sizeof(b), "%s:%u", ip, ntohs(in->sin_port));
		st_json_str(j, k, b);
	} else if (len >= sizeof(struct sockaddr_in6) && s->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = sa;
		char ip[INET6_ADDRSTRLEN];
		inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip));
		snprintf(b, sizeof(b), "[%s]:%u", ip, ntohs(in6->sin6_port));
		st_json_str(j, k, b);
	} else {
		st_json_bytes_hex(j, k, sa, len > 64 ? 64 : len);
	}
}
