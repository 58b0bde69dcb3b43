/*
 * libsigmatrace_decode: a small decode kernel for the correlator (sigmatrace/decode/kernel.py, cffi ABI mode).
 *
 * NOT part of libsigmatrace.so (that one is LD_PRELOADed into traced programs); this library is only
 * dlopen'ed by the Python reader side.  Three entry points, all allocation-free (the caller passes every
 * output buffer, sized from a previous pass) and bounds-checked (no length field is used before it is
 * checked against the buffer):
 *
 *   st_dk_scan   walk chunks from an offset: header checks, CRC-32 (zlib polynomial, slice-by-8), the
 *                structural payload checks of sigmatrace/format/reader.py (_check_payload), and per
 *                EVENTS chunk its primary-record count and TSC bounds.  Stops at the first chunk the
 *                reader would not yield (the caller hands that offset to the Python reader, which
 *                reports the loss and resynchronises), at `lim`, or when a record budget is used up.
 *   st_dk_count  per correlator type, how many primary records a set of EVENTS chunks holds.
 *   st_dk_fill   scatter those records (EXT slots joined) into per-type narrow column buffers.
 *   st_dk_split  records of whole chunks -> the ten primary columns of the events table (EXT joined).
 *
 * Format: docs/format.md (little-endian; this file assumes a little-endian host, like the numpy path).
 */
#include <stdint.h>
#include <string.h>

#define ST_EXPORT __attribute__((visibility("default")))

#define HDR_SIZE 32
#define MAGIC 0x4b435453u
#define VERSION 1u
#define MAX_PAYLOAD (16u << 20)
#define REC 24
#define T_EXT 0x0001u

enum { K_PROCESS = 1, K_EVENTS = 2, K_SIDE = 3, K_CALIB = 4, K_THREAD = 5, K_AGG = 6, K_END = 7 };

/* one scanned chunk (mirrored by a numpy structured dtype in sigmatrace/decode/kernel.py: keep the layout in step) */
typedef struct {
    int64_t offset;      /* of the chunk header */
    uint64_t uid;
    uint64_t tsc_min;    /* EVENTS: over primary records */
    uint64_t tsc_max;
    uint32_t plen;
    uint32_t count;
    uint32_t thread;
    uint32_t events;     /* EVENTS: primary (non-EXT) records */
    uint16_t kind;
    uint16_t pad0;
    uint32_t pad1;
} st_dk_chunk;           /* 56 bytes */

/* ---------------------------------------------------------------- CRC-32, zlib polynomial (reflected) */
static uint32_t crc_tab[8][256];

__attribute__((constructor)) static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
        crc_tab[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_tab[t][i] = (crc_tab[t - 1][i] >> 8) ^ crc_tab[0][crc_tab[t - 1][i] & 0xff];
}

#ifdef ST_HAVE_ZLIB
#include <zlib.h>
/* zlib's own crc32 when the build found it (it is several times faster than slice-by-8 where the
 * distribution's zlib has a folded / braided implementation); same polynomial, same convention */
static uint32_t crc_update(uint32_t crc, const uint8_t *p, size_t n)
{
    while (n) {
        uInt step = n > (1u << 30) ? (1u << 30) : (uInt)n;
        crc = (uint32_t)crc32(crc, p, step);
        p += step;
        n -= step;
    }
    return crc;
}
#else
#define crc_update crc_update_tab
#endif

/* running CRC in the zlib convention: crc32(buf, crc32(prev)) == crc_update(prev, ...) */
static __attribute__((unused)) uint32_t crc_update_tab(uint32_t crc, const uint8_t *p, size_t n)
{
    uint32_t c = ~crc;
    while (n && ((uintptr_t)p & 7)) {
        c = (c >> 8) ^ crc_tab[0][(c ^ *p++) & 0xff];
        n--;
    }
    while (n >= 8) {   /* slice-by-8: two 32-bit words per step */
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
        lo ^= c;
        c = crc_tab[7][lo & 0xff] ^ crc_tab[6][(lo >> 8) & 0xff] ^ crc_tab[5][(lo >> 16) & 0xff] ^
            crc_tab[4][lo >> 24] ^ crc_tab[3][hi & 0xff] ^ crc_tab[2][(hi >> 8) & 0xff] ^
            crc_tab[1][(hi >> 16) & 0xff] ^ crc_tab[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--)
        c = (c >> 8) ^ crc_tab[0][(c ^ *p++) & 0xff];
    return ~c;
}

ST_EXPORT uint32_t st_dk_crc32(uint32_t crc, const uint8_t *p, int64_t n)
{
    return n > 0 ? crc_update(crc, p, (size_t)n) : crc;
}

/* the table implementation alone (tested against zlib even when the build links zlib) */
ST_EXPORT uint32_t st_dk_crc32_table(uint32_t crc, const uint8_t *p, int64_t n)
{
    return n > 0 ? crc_update_tab(crc, p, (size_t)n) : crc;
}

static inline uint16_t rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* reader.py _check_payload: 1 when the payload is structurally sound (no allocation, no trust) */
static int payload_ok(unsigned kind, const uint8_t *pl, uint32_t plen, uint32_t count)
{
    switch (kind) {
    case K_EVENTS:
        if ((uint64_t)count * REC != plen)
            return 0;
        return !(count && rd16(pl + 8) == T_EXT);
    case K_CALIB:
        return (uint64_t)count * 48 == plen;
    case K_AGG:
        return (uint64_t)count * 32 == plen;
    case K_SIDE: {
        uint64_t pos = 0;
        for (uint32_t i = 0; i < count; i++) {   /* each record >= 16 bytes: bounded by plen / 16 steps */
            if (pos + 16 > plen)
                return 0;
            uint64_t len = rd32(pl + pos + 8);
            pos += 16 + len + ((8 - (len & 7)) & 7);
            if (pos > plen)
                return 0;
        }
        return pos == plen;
    }
    case K_PROCESS: case K_THREAD: case K_END:
        return 1;
    default:
        return 0;   /* unknown chunk kind */
    }
}

/*
 * Walk chunks starting at `off` while off < lim (lim <= n).  Writes up to `cap` entries to `out`; returns
 * how many.  *next_off: the offset after the last accepted chunk.  *status: 0 reached lim, 1 stopped
 * because `cap` entries or `max_records` EVENTS records were accepted (call again from *next_off),
 * 2 the chunk at *next_off is not one the reader yields (truncated, corrupt, unknown kind ...).
 * type_counts (cap x ntypes, zeroed by the caller): per EVENTS chunk, its primary records per kept type
 * (lut[type] = 1 + type index, as for st_dk_fill) — counted while the chunk is in cache after its CRC.
 */
ST_EXPORT int64_t st_dk_scan(const uint8_t *buf, int64_t n, int64_t off, int64_t lim, st_dk_chunk *out,
                             int64_t cap, int64_t max_records, int64_t *next_off, int32_t *status,
                             const uint8_t *lut, int32_t ntypes, uint32_t *type_counts)
{
    int64_t k = 0, recs = 0;
    if (lim > n)
        lim = n;
    *status = 0;
    while (off < lim) {
        if (k >= cap || recs >= max_records) {
            *status = 1;
            break;
        }
        if (off < 0 || n - off < HDR_SIZE) {
            *status = 2;
            break;
        }
        const uint8_t *h = buf + off;
        uint32_t plen = rd32(h + 20), count = rd32(h + 24);
        unsigned kind = rd16(h + 6);
        if (rd32(h) != MAGIC || rd16(h + 4) != VERSION || plen > MAX_PAYLOAD || (plen & 7) ||
            (int64_t)plen > n - off - HDR_SIZE) {
            *status = 2;
            break;
        }
        const uint8_t *pl = h + HDR_SIZE;
        uint32_t crc = crc_update(crc_update(0, h, 28), pl, plen);
        if (crc != rd32(h + 28) || !payload_ok(kind, pl, plen, count)) {
            *status = 2;
            break;
        }
        st_dk_chunk *c = &out[k++];
        c->offset = off;
        c->uid = rd64(h + 8);
        c->thread = rd32(h + 16);
        c->plen = plen;
        c->count = count;
        c->kind = (uint16_t)kind;
        c->pad0 = 0;
        c->pad1 = 0;
        c->events = 0;
        c->tsc_min = UINT64_MAX;
        c->tsc_max = 0;
        if (kind == K_EVENTS) {   /* count * 24 == plen was checked */
            uint32_t prim = 0;
            uint64_t lo = UINT64_MAX, hi = 0;
            uint32_t *tc = type_counts + (size_t)(k - 1) * (size_t)ntypes;
            for (uint32_t i = 0; i < count; i++) {
                const uint8_t *r = pl + (size_t)i * REC;
                uint16_t ty = rd16(r + 8);
                if (ty == T_EXT)
                    continue;
                if (lut[ty] && lut[ty] <= ntypes)
                    tc[lut[ty] - 1]++;
                uint64_t t = rd64(r);
                prim++;
                lo = t < lo ? t : lo;
                hi = t > hi ? t : hi;
            }
            c->events = prim;
            c->tsc_min = lo;
            c->tsc_max = hi;
            recs += count;
        }
        off += HDR_SIZE + (int64_t)plen;
    }
    *next_off = off;
    return k;
}

/* chunk list of an EVENTS set: offsets of chunk headers and record counts, already validated by st_dk_scan
 * (re-checked here against n, so a wrong call cannot read outside the buffer) */
static int chunk_ok(int64_t n, int64_t off, uint32_t count)
{
    return off >= 0 && off <= n - HDR_SIZE && (uint64_t)count * REC <= (uint64_t)(n - off - HDR_SIZE);
}

/*
 * lut[type] = 1 + index of the correlator type (0: not kept).  counts[K] += primary records per type.
 * Returns 0, or -1 when a chunk lies outside the buffer.
 */
ST_EXPORT int st_dk_count(const uint8_t *buf, int64_t n, const int64_t *offs, const uint32_t *cnts, int64_t nch,
                          const uint8_t *lut, int64_t *counts)
{
    for (int64_t j = 0; j < nch; j++) {
        if (!chunk_ok(n, offs[j], cnts[j]))
            return -1;
        const uint8_t *pl = buf + offs[j] + HDR_SIZE;
        for (uint32_t i = 0; i < cnts[j]; i++) {
            unsigned t = lut[rd16(pl + (size_t)i * REC + 8)];
            if (t)
                counts[t - 1]++;
        }
    }
    return 0;
}

/* one output column of a correlator type: where the value comes from and how it is stored */
typedef struct {
    uint8_t slot;    /* 0 aux, 1 obj, 2 arg, 3 x0, 4 x1, 5 x2, 6 x3 (x*: the following EXT record, 0 if none) */
    uint8_t lo;      /* low bit of a bit field */
    uint8_t width;   /* bit-field width, 0 = the whole slot */
    uint8_t size;    /* bytes of the output element: 1, 2, 4, 8 */
} st_dk_col;

static inline uint64_t slot_value(const uint8_t *r, const uint8_t *x, unsigned slot)
{
    switch (slot) {
    case 0: return rd16(r + 10);
    case 1: return rd32(r + 12);
    case 2: return rd64(r + 16);
    case 3: return x ? rd64(x) : 0;
    case 4: return x ? rd16(x + 10) : 0;
    case 5: return x ? rd32(x + 12) : 0;
    default: return x ? rd64(x + 16) : 0;
    }
}

/*
 * Scatter the kept records of the chunks into per-type columns.  For type k (0..K-1): ncols[k] columns
 * described by cols[k * maxc + j]; outputs are ptrs[k * (maxc + 2) + 0] (tsc, u64), + 1 (thread, u32),
 * + 2 + j (column j).  pos[k] is the next row to write for type k and caps[k] the rows allocated (from
 * st_dk_count): a record that would pass the cap is an error (-2), never a write.
 */
ST_EXPORT int st_dk_fill(const uint8_t *buf, int64_t n, const int64_t *offs, const uint32_t *cnts,
                         const uint32_t *threads, int64_t nch, const uint8_t *lut, const st_dk_col *cols,
                         const int32_t *ncols, int32_t maxc, void *const *ptrs, int64_t *pos, const int64_t *caps)
{
    for (int64_t j = 0; j < nch; j++) {
        if (!chunk_ok(n, offs[j], cnts[j]))
            return -1;
        const uint8_t *pl = buf + offs[j] + HDR_SIZE;
        uint32_t cnt = cnts[j];
        for (uint32_t i = 0; i < cnt; i++) {
            const uint8_t *r = pl + (size_t)i * REC;
            unsigned t = lut[rd16(r + 8)];
            if (!t)
                continue;
            unsigned k = t - 1;
            int64_t row = pos[k];
            if (row >= caps[k])
                return -2;
            pos[k] = row + 1;
            /* EXT join: the next record of the same chunk, when it is an EXT */
            const uint8_t *x = (i + 1 < cnt && rd16(r + REC + 8) == T_EXT) ? r + REC : NULL;
            void *const *p = ptrs + (size_t)k * (maxc + 2);
            ((uint64_t *)p[0])[row] = rd64(r);
            ((uint32_t *)p[1])[row] = threads[j];
            const st_dk_col *c = cols + (size_t)k * maxc;
            for (int32_t q = 0; q < ncols[k]; q++) {
                uint64_t v = slot_value(r, x, c[q].slot);
                if (c[q].width) {
                    v = c[q].lo < 64 ? v >> c[q].lo : 0;
                    if (c[q].width < 64)
                        v &= (UINT64_C(1) << c[q].width) - 1;
                }
                void *o = p[2 + q];
                switch (c[q].size) {
                case 1: ((uint8_t *)o)[row] = (uint8_t)v; break;
                case 2: ((uint16_t *)o)[row] = (uint16_t)v; break;
                case 4: ((uint32_t *)o)[row] = (uint32_t)v; break;
                default: ((uint64_t *)o)[row] = v; break;
                }
            }
        }
    }
    return 0;
}

/*
 * Records of whole chunks (rec: nrec contiguous 24-byte records; cnts/threads per chunk, summing to nrec)
 * -> primary columns with their first EXT's slots (0 when absent).  cap: rows allocated in every output.
 * Returns rows written, -1 when the counts do not add up, -2 when the rows would pass cap.
 */
ST_EXPORT int64_t st_dk_split(const uint8_t *rec, int64_t nrec, const uint32_t *cnts, const uint32_t *threads,
                              int64_t nch, int64_t cap, uint32_t *thread, uint64_t *tsc, uint16_t *type,
                              uint16_t *aux, uint32_t *obj, uint64_t *arg, uint64_t *x0, uint16_t *x1,
                              uint32_t *x2, uint64_t *x3)
{
    int64_t base = 0, m = 0;
    for (int64_t j = 0; j < nch; j++) {
        int64_t cnt = cnts[j];
        if (cnt > nrec - base)
            return -1;
        const uint8_t *pl = rec + base * REC;
        for (int64_t i = 0; i < cnt; i++) {
            const uint8_t *r = pl + i * REC;
            uint16_t t = rd16(r + 8);
            if (t == T_EXT)
                continue;
            if (m >= cap)
                return -2;
            const uint8_t *x = (i + 1 < cnt && rd16(r + REC + 8) == T_EXT) ? r + REC : NULL;
            thread[m] = threads[j];
            tsc[m] = rd64(r);
            type[m] = t;
            aux[m] = rd16(r + 10);
            obj[m] = rd32(r + 12);
            arg[m] = rd64(r + 16);
            x0[m] = x ? rd64(x) : 0;
            x1[m] = x ? rd16(x + 10) : 0;
            x2[m] = x ? rd32(x + 12) : 0;
            x3[m] = x ? rd64(x + 16) : 0;
            m++;
        }
        base += cnt;
    }
    return base == nrec ? m : -1;
}

/* ------------------------------------------------------------------ correlator joins (correlate.ops.match_kth) */

/*
 * k-th occurrence join of two key arrays already sorted (ascending; ties in time order): inside each key
 * group the i-th row of a is paired with the i-th row of b while both have one.  Writes the pair positions
 * (into the sorted arrays) to ia / ib (room for min(na, nb) each) in the order of a; returns the count.
 * One linear merge instead of group ranks + two binary searches per row.
 */
ST_EXPORT int64_t st_dk_match_sorted(const int64_t *ka, int64_t na, const int64_t *kb, int64_t nb, int64_t *ia,
                                     int64_t *ib)
{
    int64_t i = 0, j = 0, m = 0, cap = na < nb ? na : nb;
    while (i < na && j < nb) {
        if (ka[i] < kb[j]) {
            i++;
        } else if (kb[j] < ka[i]) {
            j++;
        } else {   /* same key: pair rank by rank, then skip the rest of both groups */
            int64_t key = ka[i];
            while (i < na && j < nb && ka[i] == key && kb[j] == key) {
                if (m >= cap)
                    return -1;   /* impossible for sorted input; never write past the buffers */
                ia[m] = i++;
                ib[m] = j++;
                m++;
            }
            while (i < na && ka[i] == key)
                i++;
            while (j < nb && kb[j] == key)
                j++;
        }
    }
    return m;
}
