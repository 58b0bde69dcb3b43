/*
 * Timestamps: raw TSC on x86 (one rdtsc, ~7 ns, no syscall), CLOCK_MONOTONIC_RAW
 * nanoseconds elsewhere.  Calibration pairs bracket the clock reads with two
 * TSC reads so the correlator knows how tight each pair is (contract 2).
 */
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "core.h"

#ifndef CLOCK_TAI
#define CLOCK_TAI 11
#endif

uint64_t st_tsc_fallback(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t ts_ns(clockid_t id, int *ok)
{
	struct timespec ts;
	if (clock_gettime(id, &ts) != 0) {
		*ok = 0;
		return 0;
	}
	*ok = 1;
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t st_now_ns(void)
{
	int ok;
	return ts_ns(CLOCK_MONOTONIC, &ok);
}

int st_tsc_invariant(void)
{
#if defined(__x86_64__) || defined(__i386__)
	unsigned a, b, c, d;
	if (__get_cpuid(0x80000000u, &a, &b, &c, &d) && a >= 0x80000007u &&
	    __get_cpuid(0x80000007u, &a, &b, &c, &d))
		return (d >> 8) & 1;
#endif
	return 0;
}

void st_calibrate(struct st_calibration *c, uint32_t point)
{
	int ok_raw, ok_rt, ok_tai;
	/* Tightest bracket of a few tries: a preemption inside one try would
	 * otherwise widen the uncertainty of the pair. */
	struct st_calibration best = {0};
	uint64_t best_w = ~0ull;
	for (int i = 0; i < 3; i++) {
		struct st_calibration x = {0};
		x.tsc_before = st_tsc();
		x.monotonic_raw_ns = ts_ns(CLOCK_MONOTONIC_RAW, &ok_raw);
		x.realtime_ns = ts_ns(CLOCK_REALTIME, &ok_rt);
		x.tai_ns = ts_ns(CLOCK_TAI, &ok_tai);
		x.tsc_after = st_tsc();
		uint64_t w = x.tsc_after - x.tsc_before;
		if (w < best_w) {
			best_w = w;
			best = x;
		}
	}
	best.point = point;
	best.flags = 0;
	/* CLOCK_TAI equals REALTIME until someone (ptp4l/chrony) sets the TAI
	 * offset; only then is it a real TAI reading. */
	if (ok_tai && best.tai_ns && (best.tai_ns > best.realtime_ns + 1000000000ull))
		best.flags |= ST_CALIB_F_TAI_VALID;
	else
		best.tai_ns = 0;
	if (st_tsc_invariant())
		best.flags |= ST_CALIB_F_INVARIANT_TSC;
	*c = best;
}

double st_tsc_hz_estimate(const struct st_calibration *a, const struct st_calibration *b)
{
	double dns = (double)(b->monotonic_raw_ns - a->monotonic_raw_ns);
	double dtsc = ((double)b->tsc_before + (double)b->tsc_after) / 2 -
		      ((double)a->tsc_before + (double)a->tsc_after) / 2;
	if (b->monotonic_raw_ns <= a->monotonic_raw_ns || dns < 1e5 || dtsc <= 0)
		return 0;
	return dtsc * 1e9 / dns;
}
