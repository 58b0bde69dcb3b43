/* The emulated NIC's atomic operations on responder memory (ref §1.6, §1.7):
 *
 *   ATOMIC_CS (0x11), ATOMIC_FA (0x12)      8 bytes, the IB atomics;
 *   ATOMIC_MASKED_CS (0x14), _MASKED_FA (0x15) with the extended-atomic opmod
 *   0x08 (4 bytes) or 0x09 (8 bytes), the forms NVSHMEM's IBGDA posts
 *   (ibgda_device.cuh ibgda_write_atomic_wqe):
 *     masked CS: if ((old ^ compare) & compare_mask) == 0 the bits of
 *       swap_mask are replaced by those of swap: new = (old & ~swap_mask) |
 *       (swap & swap_mask).  NVSHMEM's set/swap (swap_mask all ones,
 *       compare_mask 0), and (swap = v, swap_mask = ~v), or (swap = swap_mask
 *       = v) and compare-swap (both masks all ones) are this one operation;
 *     masked FA: add with carries cut at the field boundaries: a bit set in
 *       field_boundary ends a field, the carry out of it is dropped.
 *       Boundary 0 is an ordinary add, all ones adds bit by bit without
 *       carries -- NVSHMEM's xor (field_boundary = UINT32/64_MAX).
 *   The masked-FA boundary rule is inferred from how NVSHMEM encodes add and
 *   xor; the reference has no PRM text for it (§1.7, §8: UNCONFIRMED).
 *
 * Memory is in host byte order (the HCA reports atomic_req_8B_endianness_mode
 * 1, host endianness, devx_prm.c): the operands arrive big-endian in the WQE
 * and are applied to the host-order value in memory, as NVSHMEM expects (its
 * signal and counter words are read natively by the target GPU).  The
 * original value goes back to the requester, which stores 8-byte results in
 * host order and 4-byte results big-endian (requester.c; NVSHMEM's fetch
 * byte-swaps only 4-byte results, nvshmemi_ibgda_amo_fetch_impl).
 *
 * Host memory is updated with a compare-and-swap loop (atomic with the
 * process's own CPU atomics); GPU memory with a DMA read and write
 * (dma.c: atomic among the NIC's operations only, as an HCA's atomics are). */
#include <string.h>

#include "emu_internal.h"

/* x + y over `bits` bits, the carry cut after every bit set in boundary */
static uint64_t field_add(uint64_t x, uint64_t y, uint64_t boundary, unsigned bits)
{
	if (!boundary) {
		uint64_t r = x + y;
		return bits == 64 ? r : r & ((1ull << bits) - 1);
	}
	uint64_t r = 0, carry = 0;
	for (unsigned i = 0; i < bits; i++) {
		uint64_t a = (x >> i) & 1, b = (y >> i) & 1;
		r |= (a ^ b ^ carry) << i;
		uint64_t c = (a & b) | (a & carry) | (b & carry);
		carry = ((boundary >> i) & 1) ? 0 : c;
	}
	return r;
}

/* The new value of a location holding old under the operation. */
static uint64_t amo_new(const struct emu_amo *o, uint64_t old)
{
	unsigned bits = o->size * 8;
	uint64_t m = bits == 64 ? ~0ull : (1ull << bits) - 1;
	switch (o->op) {
	case ST_MLX5_OPCODE_ATOMIC_FA:
		return old + o->a;
	case ST_MLX5_OPCODE_ATOMIC_CS:
		return old == o->b ? o->a : old;
	case ST_MLX5_OPCODE_ATOMIC_MASKED_FA:
		return field_add(old, o->a & m, o->am & m, bits);
	case ST_MLX5_OPCODE_ATOMIC_MASKED_CS:
		if ((old ^ o->b) & o->bm & m)
			return old;
		return ((old & ~o->am) | (o->a & o->am)) & m;
	}
	return old;
}

/* Apply o at addr (aligned to o->size, inside an MR the caller checked):
 * 0 and the original value in *orig, or -1 when GPU memory could not be
 * copied. */
EXPORT int emu_amo_apply(const struct emu_amo *o, uint64_t addr, uint64_t *orig)
{
	if (emu_dma_is_device(addr, o->size)) {
		uint64_t old = 0;
		if (emu_dma_read(&old, addr, o->size))
			return -1;
		uint64_t nw = amo_new(o, old);
		if (nw != old && emu_dma_write(addr, &nw, o->size))
			return -1;
		*orig = old;
		return 0;
	}
	if (o->size == 4) {
		uint32_t *p = (uint32_t *)(uintptr_t)addr, old = __atomic_load_n(p, __ATOMIC_RELAXED), nw;
		do
			nw = (uint32_t)amo_new(o, old);
		while (!__atomic_compare_exchange_n(p, &old, nw, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
		*orig = old;
		return 0;
	}
	uint64_t *p = (uint64_t *)(uintptr_t)addr, old = __atomic_load_n(p, __ATOMIC_RELAXED), nw;
	do
		nw = amo_new(o, old);
	while (!__atomic_compare_exchange_n(p, &old, nw, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
	*orig = old;
	return 0;
}

/* Parse the atomic segments of a WQE (w: the WQE, off: just past the remote
 * address segment, ds: its DS) into o and the local result segment *data:
 * 0, or the syndrome of a WQE the HCA refuses (LOCAL_QP_OP_ERR: an opmod other
 * than 0x08/0x09 on a masked atomic, segments past DS). */
EXPORT int emu_amo_parse(const uint8_t *w, uint32_t off, uint32_t ds, uint32_t opcode, uint32_t opmod,
			 struct emu_amo *o, const struct st_mlx5_wqe_data_seg **data)
{
	memset(o, 0, sizeof *o);
	o->op = (uint8_t)opcode;
	o->opmod = (uint8_t)opmod;
	uint32_t seg_bytes = 16;
	if (opcode == ST_MLX5_OPCODE_ATOMIC_CS || opcode == ST_MLX5_OPCODE_ATOMIC_FA) {
		o->size = 8;
	} else if (opmod == ST_MLX5_OPMOD_EXT_ATOMIC_4B) {
		o->size = 4;
	} else if (opmod == ST_MLX5_OPMOD_EXT_ATOMIC_8B) {
		o->size = 8;
		if (opcode == ST_MLX5_OPCODE_ATOMIC_MASKED_CS)
			seg_bytes = 32; /* {swap, compare} then {swap_mask, compare_mask} */
	} else {
		return ST_MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR;
	}
	if (off + seg_bytes + 16 > ds * 16)
		return ST_MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR;
	const uint8_t *s = w + off;
	uint64_t v64[4];
	uint32_t v32[4];
	memcpy(v64, s, seg_bytes);
	memcpy(v32, s, 16);
	if (o->size == 8) {
		o->a = be64toh(v64[0]);
		o->b = be64toh(v64[1]);
		if (opcode == ST_MLX5_OPCODE_ATOMIC_MASKED_FA) {
			o->am = o->b; /* field boundary */
			o->b = 0;
		} else if (opcode == ST_MLX5_OPCODE_ATOMIC_MASKED_CS) {
			o->am = be64toh(v64[2]); /* swap mask */
			o->bm = be64toh(v64[3]); /* compare mask */
		}
	} else if (opcode == ST_MLX5_OPCODE_ATOMIC_MASKED_FA) {
		o->a = be32toh(v32[0]);  /* add_data */
		o->am = be32toh(v32[1]); /* field_boundary */
	} else {
		o->a = be32toh(v32[0]);  /* swap_data */
		o->b = be32toh(v32[1]);  /* compare_data */
		o->am = be32toh(v32[2]); /* swap_mask */
		o->bm = be32toh(v32[3]); /* compare_mask */
	}
	*data = (const struct st_mlx5_wqe_data_seg *)(s + seg_bytes);
	return 0;
}
