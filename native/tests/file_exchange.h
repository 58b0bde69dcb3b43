/* file_exchange.h -- two test processes swap small text messages through files
 * in a shared directory (written to a temporary name, then renamed, so a
 * reader never sees half a message). */
#ifndef SIGMATRACE_TESTS_FILE_EXCHANGE_H
#define SIGMATRACE_TESTS_FILE_EXCHANGE_H

#include <stdio.h>
#include <time.h>
#include <unistd.h>

/* 0, or -1 when the file cannot be written */
static inline int xchg_put(const char *dir, const char *name, const char *text)
{
	char tmp[512], fin[512];
	snprintf(tmp, sizeof tmp, "%s/.%s.tmp", dir, name);
	snprintf(fin, sizeof fin, "%s/%s", dir, name);
	FILE *f = fopen(tmp, "w");
	if (!f)
		return -1;
	fputs(text, f);
	fclose(f);
	return rename(tmp, fin) ? -1 : 0;
}

/* Wait up to timeout_s for dir/name and read it into buf: 0, or -1 on timeout. */
static inline int xchg_get(const char *dir, const char *name, char *buf, size_t n, double timeout_s)
{
	char fin[512];
	snprintf(fin, sizeof fin, "%s/%s", dir, name);
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		FILE *f = fopen(fin, "r");
		if (f) {
			size_t r = fread(buf, 1, n - 1, f);
			buf[r] = 0;
			fclose(f);
			return 0;
		}
		clock_gettime(CLOCK_MONOTONIC, &t);
		if ((double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) * 1e-9 > timeout_s)
			return -1;
		usleep(2000);
	}
}

#endif
