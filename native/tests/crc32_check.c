/*
 * The recorder's CRC-32 (core/crc32.c) on a deterministic buffer, for
 * tests/test_format_conformance.py to compare with zlib.crc32:
 *
 *   crc32_check SEED OFFSET LENGTH ...   one line "<offset> <length> <crc>" per pair
 *
 * The first line says which implementation ran: "accelerated 0|1".  The
 * buffer is byte i = (i * 2654435761 >> 13) & 0xff; the CRC starts from SEED
 * (a chained call, like the chunk header then payload).
 */
#include <stdio.h>
#include <stdlib.h>

#include "core/core.h"

int main(int argc, char **argv)
{
	static unsigned char buf[1 << 20];
	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = (unsigned char)(((uint64_t)i * 2654435761u) >> 13);
	if (argc < 2)
		return 2;
	uint32_t seed = (uint32_t)strtoul(argv[1], NULL, 0);
	st_crc32(0, buf, 0); /* initialises, so the line below is true */
	printf("accelerated %d\n", st_crc32_accelerated());
	for (int i = 2; i + 1 < argc; i += 2) {
		size_t off = strtoul(argv[i], NULL, 0), len = strtoul(argv[i + 1], NULL, 0);
		if (off + len > sizeof(buf))
			return 2;
		printf("%zu %zu %u\n", off, len, st_crc32(seed, buf + off, len));
	}
	return 0;
}
