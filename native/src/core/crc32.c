/*
 * CRC-32 (zlib / IEEE 802.3 polynomial, reflected), slice-by-8.  Only the
 * writer thread computes it, but on a 2-core machine it competes with the
 * traced program, so it should not be the slow byte-at-a-time version.
 */
#include <pthread.h>
#include <string.h>

#include "core.h"

static uint32_t tab[8][256];
static pthread_once_t once = PTHREAD_ONCE_INIT;

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
}

uint32_t st_crc32(uint32_t crc, const void *buf, size_t len)
{
	pthread_once(&once, init_tables);
	const unsigned char *p = buf;
	crc = ~crc;
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
	return ~crc;
}
