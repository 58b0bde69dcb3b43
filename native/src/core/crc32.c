/*
 * CRC-32 (zlib / IEEE 802.3 polynomial, reflected).  Only the writer
 * computes it, but on a 2-core machine it competes with the traced program
 * for the CPU: every byte recorded passes through here once.
 *
 *  - slice-by-8 tables everywhere (~1 cycle per byte);
 *  - on x86 with PCLMULQDQ, buffers of 64 bytes and more are first folded
 *    128 bits at a time with carry-less multiplications (the method of
 *    Gopal et al., "Fast CRC Computation for Generic Polynomials Using
 *    PCLMULQDQ Instruction", Intel, 2009), ~10x less CPU; what is left (16
 *    folded bytes and the tail) goes through the tables.  The folding
 *    constants are computed here at first use, and the folded result is
 *    checked against the tables once: a mismatch keeps the tables.
 */
#include <pthread.h>
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "core.h"

static uint32_t tab[8][256];
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int use_clmul;

/* The raw state update (no inversion): state' = state * x^(8 len) + buf * x^32 mod P, reflected. */
static uint32_t crc_tables(uint32_t crc, const unsigned char *p, size_t len)
{
	while (len && ((uintptr_t)p & 7)) {
		crc = tab[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
		len--;
	}
	while (len >= 8) {
		uint32_t lo, hi;
		memcpy(&lo, p, 4);
		memcpy(&hi, p + 4, 4);
		lo ^= crc;
		crc = tab[7][lo & 0xff] ^ tab[6][(lo >> 8) & 0xff] ^ tab[5][(lo >> 16) & 0xff] ^ tab[4][lo >> 24] ^
		      tab[3][hi & 0xff] ^ tab[2][(hi >> 8) & 0xff] ^ tab[1][(hi >> 16) & 0xff] ^ tab[0][hi >> 24];
		p += 8;
		len -= 8;
	}
	while (len--)
		crc = tab[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
	return crc;
}

#if defined(__x86_64__)
/*
 * Bit j of a little-endian 64-bit load of 8 message bytes is the coefficient
 * of x^(63-j) of those bytes read as a polynomial (reflected order), and the
 * carry-less product of two such values, read the same way over 128 bits, is
 * the product of the polynomials times x.  Folding a 16-byte block A (halves
 * lo, hi) over D bytes onto the block D bytes later replaces A * x^(8D) by
 * lo * (x^(8D+63) mod P) + hi * (x^(8D-1) mod P), which is congruent mod P
 * and at most 96 bits long.
 */
static __m128i k_fold64, k_fold16; /* (lo constant, hi constant) for D = 64 and D = 16 */

static uint32_t xpow_mod(unsigned n) /* x^n mod P, bit d = coefficient of x^d */
{
	uint32_t r = 1;
	while (n--)
		r = (r & 0x80000000u) ? (r << 1) ^ 0x04C11DB7u : r << 1;
	return r;
}

static uint64_t reflect_const(uint32_t r) /* bit d -> bit 63-d */
{
	uint64_t k = 0;
	for (int d = 0; d < 32; d++)
		if (r >> d & 1)
			k |= 1ull << (63 - d);
	return k;
}

__attribute__((target("pclmul,sse2"))) static inline __m128i fold(__m128i a, __m128i k, __m128i b)
{
	__m128i lo = _mm_clmulepi64_si128(a, k, 0x00); /* a.lo * k.lo */
	__m128i hi = _mm_clmulepi64_si128(a, k, 0x11); /* a.hi * k.hi */
	return _mm_xor_si128(_mm_xor_si128(lo, hi), b);
}

/* len >= 64.  The raw state crc goes into the first 4 bytes (x^32 framing
 * of the tables), the message is folded to 16 bytes, which the tables finish
 * with the tail. */
__attribute__((target("pclmul,sse2"))) static uint32_t crc_clmul(uint32_t crc, const unsigned char *p, size_t len)
{
	__m128i v0 = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), _mm_cvtsi32_si128((int)crc));
	__m128i v1 = _mm_loadu_si128((const __m128i *)(p + 16));
	__m128i v2 = _mm_loadu_si128((const __m128i *)(p + 32));
	__m128i v3 = _mm_loadu_si128((const __m128i *)(p + 48));
	p += 64;
	len -= 64;
	while (len >= 64) {
		v0 = fold(v0, k_fold64, _mm_loadu_si128((const __m128i *)p));
		v1 = fold(v1, k_fold64, _mm_loadu_si128((const __m128i *)(p + 16)));
		v2 = fold(v2, k_fold64, _mm_loadu_si128((const __m128i *)(p + 32)));
		v3 = fold(v3, k_fold64, _mm_loadu_si128((const __m128i *)(p + 48)));
		p += 64;
		len -= 64;
	}
	v1 = fold(v0, k_fold16, v1);
	v2 = fold(v1, k_fold16, v2);
	v3 = fold(v2, k_fold16, v3);
	while (len >= 16) {
		v3 = fold(v3, k_fold16, _mm_loadu_si128((const __m128i *)p));
		p += 16;
		len -= 16;
	}
	unsigned char rest[16];
	_mm_storeu_si128((__m128i *)rest, v3);
	return crc_tables(crc_tables(0, rest, 16), p, len);
}

static void init_clmul(void)
{
	unsigned a, b, c, d;
	if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_PCLMUL) || !(d & bit_SSE2))
		return;
	k_fold64 = _mm_set_epi64x((long long)reflect_const(xpow_mod(8 * 64 - 1)),
				  (long long)reflect_const(xpow_mod(8 * 64 + 63)));
	k_fold16 = _mm_set_epi64x((long long)reflect_const(xpow_mod(8 * 16 - 1)),
				  (long long)reflect_const(xpow_mod(8 * 16 + 63)));
	unsigned char probe[1031];
	for (unsigned i = 0; i < sizeof(probe); i++)
		probe[i] = (unsigned char)(i * 131 + (i >> 3) * 7 + 1);
	for (size_t n = 64; n <= sizeof(probe); n += 71)
		if (crc_clmul(0x12345678u, probe, n) != crc_tables(0x12345678u, probe, n))
			return;
	use_clmul = 1;
}
#endif

static void init_tables(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
		tab[0][i] = c;
	}
	for (uint32_t i = 0; i < 256; i++)
		for (int s = 1; s < 8; s++)
			tab[s][i] = (tab[s - 1][i] >> 8) ^ tab[0][tab[s - 1][i] & 0xff];
#if defined(__x86_64__)
	init_clmul();
#endif
}

uint32_t st_crc32(uint32_t crc, const void *buf, size_t len)
{
	pthread_once(&once, init_tables);
#if defined(__x86_64__)
	if (use_clmul && len >= 64)
		return ~crc_clmul(~crc, buf, len);
#endif
	return ~crc_tables(~crc, buf, len);
}

int st_crc32_accelerated(void)
{
	pthread_once(&once, init_tables);
	return use_clmul;
}
