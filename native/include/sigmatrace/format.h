/*
 * sigmatrace trace format, version 1 — the C definition.
 *
 * The normative text is docs/format.md; the Python definition is
 * sigmatrace/format/layout.py.  tests/test_format_conformance.py compiles a
 * program against this header and checks every size, offset and constant
 * against the Python side, so the two cannot drift apart silently.
 *
 * A trace file is a sequence of chunks.  Every chunk is a 32-byte header
 * followed by payload_len bytes of payload (a multiple of 8).  Files written
 * by several processes may be concatenated byte for byte: each chunk names
 * the process (process_uid) and thread (thread_index) it came from.
 * Everything is little-endian.
 */
#ifndef SIGMATRACE_FORMAT_H
#define SIGMATRACE_FORMAT_H

#include <stdint.h>

#define ST_FORMAT_MAGIC      0x4b435453u /* bytes "STCK" */
#define ST_FORMAT_VERSION    1u
#define ST_MAX_PAYLOAD       (16u << 20) /* readers reject larger chunks */

/* Chunk kinds. */
enum st_chunk_kind {
	ST_CHUNK_PROCESS     = 1, /* JSON process header (identity, mode, NICs, GPUs) */
	ST_CHUNK_EVENTS      = 2, /* count x struct st_event */
	ST_CHUNK_SIDE        = 3, /* count x (struct st_side_header + data, 8-aligned) */
	ST_CHUNK_CALIBRATION = 4, /* count x struct st_calibration */
	ST_CHUNK_THREAD      = 5, /* JSON thread description */
	ST_CHUNK_AGGREGATE   = 6, /* count x struct st_aggregate */
	ST_CHUNK_END         = 7, /* JSON footer: totals, drops, exit reason */
};

struct st_chunk_header {
	uint32_t magic;        /* ST_FORMAT_MAGIC */
	uint16_t version;      /* ST_FORMAT_VERSION */
	uint16_t kind;         /* enum st_chunk_kind */
	uint64_t process_uid;  /* random per process (new after fork) */
	uint32_t thread_index; /* 0 = process-level; threads count from 1 */
	uint32_t payload_len;  /* bytes after this header; multiple of 8 */
	uint32_t count;        /* records in the payload (kind-specific) */
	uint32_t crc32;        /* CRC-32 (zlib) of header bytes 0..27, then payload */
};

/*
 * The hot record.  24 bytes.  `type` is (layer << 8) | operation, see
 * events.h.  The meaning of aux/obj/arg is fixed per type (events.h and
 * sigmatrace/format/events.py).  A record of type ST_EV_EXT continues the
 * nearest preceding non-EXT record of the same chunk: its fields are then
 * read as x0 (tsc slot), x1 (aux slot), x2 (obj slot), x3 (arg slot).
 * Writers never split a record from its EXT records across chunks.
 */
struct st_event {
	uint64_t tsc;
	uint16_t type;
	uint16_t aux;
	uint32_t obj;
	uint64_t arg;
};

/* Side records carry variable-size data referenced from events by side_id. */
enum st_side_kind {
	ST_SIDE_STRING      = 1, /* UTF-8 text, no terminator */
	ST_SIDE_JSON        = 2, /* UTF-8 JSON object */
	ST_SIDE_PRM_COMMAND = 3, /* struct st_side_prm + in bytes + out bytes */
	ST_SIDE_WQE_BYTES   = 4, /* struct st_side_wqe + num_wqebb x 64 bytes */
	ST_SIDE_BLOB        = 5, /* opaque bytes */
};

struct st_side_header {
	uint64_t side_id; /* unique within the process, > 0 */
	uint32_t length;  /* data bytes that follow (before padding to 8) */
	uint16_t kind;    /* enum st_side_kind */
	uint16_t flags;
};

struct st_side_prm {
	uint32_t in_len;
	uint32_t out_len;
};

struct st_side_wqe {
	uint32_t qpn;
	uint16_t first_wqe_index; /* 16-bit WQEBB counter of the first slot */
	uint16_t num_wqebb;
	uint32_t log_sq_size;     /* log2 of the ring's WQEBB count */
	uint32_t flags;           /* ST_WQE_F_* */
};
#define ST_WQE_F_VERIFIED   0x1u /* every ctrl wqe_index matched the producer index */
#define ST_WQE_F_OVERWRITTEN 0x2u /* at least one slot was overwritten before copy */

/* TSC <-> clock calibration pair (contract 2 of ARCHITECTURE.md). */
struct st_calibration {
	uint64_t tsc_before;
	uint64_t tsc_after;
	uint64_t monotonic_raw_ns;
	uint64_t realtime_ns;
	uint64_t tai_ns;   /* 0 when no TAI/PTP clock is available */
	uint32_t point;    /* enum st_calib_point */
	uint32_t flags;    /* ST_CALIB_F_* */
};
enum st_calib_point { ST_CALIB_START = 0, ST_CALIB_PERIODIC = 1, ST_CALIB_END = 2 };
#define ST_CALIB_F_TAI_VALID     0x1u
#define ST_CALIB_F_PTP           0x2u /* realtime is PTP-disciplined */
#define ST_CALIB_F_INVARIANT_TSC 0x4u

/* Aggregate-mode counter: (type, aux, local obj, peer) -> count, bytes. */
struct st_aggregate {
	uint16_t type;
	uint16_t aux;
	uint32_t obj;
	uint64_t peer;
	uint64_t count;
	uint64_t bytes;
};

/*
 * PROCESS header key (docs/format.md): the libraries the process loaded that the tracer did not
 * trace, because their provider was disabled or is not in this build.  A JSON array of
 * {"library": soname, "path": loaded file, "provider": name, "reason": one of the two below}.
 */
#define ST_HEADER_UNTRACED_LIBRARIES "untraced_libraries"
#define ST_UNTRACED_DISABLED         "disabled"  /* not in SIGMATRACE_PROVIDERS */
#define ST_UNTRACED_NOT_BUILT        "not_built" /* this libsigmatrace.so has no such provider */

#ifdef __cplusplus
#define ST_STATIC_ASSERT static_assert
#else
#define ST_STATIC_ASSERT _Static_assert
#endif
ST_STATIC_ASSERT(sizeof(struct st_chunk_header) == 32, "chunk header is 32 bytes");
ST_STATIC_ASSERT(sizeof(struct st_event) == 24, "event is 24 bytes");
ST_STATIC_ASSERT(sizeof(struct st_side_header) == 16, "side header is 16 bytes");
ST_STATIC_ASSERT(sizeof(struct st_side_wqe) == 16, "wqe side header is 16 bytes");
ST_STATIC_ASSERT(sizeof(struct st_calibration) == 48, "calibration is 48 bytes");
ST_STATIC_ASSERT(sizeof(struct st_aggregate) == 32, "aggregate is 32 bytes");

#endif /* SIGMATRACE_FORMAT_H */
