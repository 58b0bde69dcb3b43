/*
 * mlx5_vectors: writes mlx5 WQEs, send-queue rings, CQEs, doorbells and PRM command
 * buffers to stdout, built ONLY with rdma-core's own definitions from
 * <infiniband/mlx5dv.h> (mlx5dv_set_ctrl_seg, mlx5dv_set_data_seg, the segment and
 * CQE structs, MLX5_* constants, _devx_set/_devx_set64) and htobe*.
 * tests/test_mlx5_vectors.py compiles and runs it, decodes every line with
 * sigmatrace.mlx5 and rebuilds the same bytes with the Python encoders.
 *
 * Output: one record per line, "<kind> <name> key=value ... [hex=<bytes>]".
 * Numbers are hex with 0x; sgeN=<byte_count>:<lkey>:<addr>; inline=/payload=/hex= are
 * byte strings.  Layout facts: ../shared/reference/mlx5.md (ref §n).
 *
 * rdma-core v44 has no mlx5dv_set_remote_data_seg: the remote-address segment is
 * filled through struct mlx5_wqe_raddr_seg.
 *
 * Over 600 lines: every test vector built from rdma-core's own headers in one program, so
 * all of them come from one build against one set of definitions.
 */
#define _GNU_SOURCE
#include <endian.h>
#include <infiniband/mlx5dv.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Opcodes of ref §2.1 that the v44 header does not define (values from the reference). */
#define OP_WAIT 0x0f
#define OP_BIND_MW 0x18
#define OP_GET_PSV 0x21
#define OP_CHECK_PSV 0x22
#define OP_DUMP 0x23
#define OP_RGET_PSV 0x26
#define OP_RCHECK_PSV 0x27
#define OP_ENHANCED_MPSW 0x29
#define OP_ACCESS_ASO 0x2d
#define EXT_AMO_OPMOD_4B 0x08 /* ref §1.7 */
#define EXT_AMO_OPMOD_8B 0x09

enum amo_kind { AMO_NONE, AMO_PLAIN, AMO_MASKED_4B, AMO_MASKED_8B, AMO_MASKED_GENERIC };

struct wqe_spec {
	const char *name;
	uint8_t opcode, opmod, fm_ce_se, signature;
	uint16_t idx;
	uint32_t qpn, imm;
	int has_raddr;
	uint64_t raddr;
	uint32_t rkey;
	enum amo_kind amo;
	uint64_t swap_add, compare, swap_add_mask, compare_mask, field_boundary;
	int nsge;
	uint32_t sge_bc[4], sge_lkey[4];
	uint64_t sge_addr[4];
	int inl_len;
	uint8_t inl[64];
	int payload_len;
	uint8_t payload[32];
	int ds; /* 0: computed from the segments; else forced (zero-filled tail) */
};

/* A send queue ring; a WQE's byte o lives in slot (first_slot + o/64) mod nslots (ref §1.1). */
struct ring {
	uint8_t *buf;
	unsigned nslots;
	unsigned first_slot;
};

static void *at(const struct ring *r, unsigned off)
{
	unsigned slot = (r->first_slot + off / MLX5_SEND_WQE_BB) & (r->nslots - 1);
	return r->buf + slot * MLX5_SEND_WQE_BB + off % MLX5_SEND_WQE_BB;
}

static void put_bytes(const struct ring *r, unsigned off, const uint8_t *p, int n)
{
	for (int i = 0; i < n; i++)
		*(uint8_t *)at(r, off + i) = p[i];
}

/* Writes the WQE of s at r (segments first, ctrl last, as a poster does); returns DS. */
static unsigned write_wqe(const struct ring *r, const struct wqe_spec *s)
{
	unsigned off = sizeof(struct mlx5_wqe_ctrl_seg);

	if (s->has_raddr) {
		struct mlx5_wqe_raddr_seg *rs = at(r, off);
		rs->raddr = htobe64(s->raddr);
		rs->rkey = htobe32(s->rkey);
		rs->reserved = 0;
		off += sizeof(*rs);
	}
	switch (s->amo) {
	case AMO_NONE:
		break;
	case AMO_PLAIN: {
		struct mlx5_wqe_atomic_seg *as = at(r, off);
		as->swap_add = htobe64(s->swap_add);
		as->compare = htobe64(s->compare);
		off += sizeof(*as);
		break;
	}
	case AMO_MASKED_4B: { /* 16-byte segment of BE32 words, ref §1.7 */
		uint32_t *w = at(r, off);
		if (s->opcode == MLX5_OPCODE_ATOMIC_MASKED_CS) {
			w[0] = htobe32((uint32_t)s->swap_add);
			w[1] = htobe32((uint32_t)s->compare);
			w[2] = htobe32((uint32_t)s->swap_add_mask);
			w[3] = htobe32((uint32_t)s->compare_mask);
		} else {
			w[0] = htobe32((uint32_t)s->swap_add);
			w[1] = htobe32((uint32_t)s->field_boundary);
			w[2] = w[3] = 0;
		}
		off += 16;
		break;
	}
	case AMO_MASKED_8B:
	case AMO_MASKED_GENERIC: {
		struct mlx5_wqe_atomic_seg *as = at(r, off);
		as->swap_add = htobe64(s->swap_add);
		if (s->amo == AMO_MASKED_8B && s->opcode == MLX5_OPCODE_ATOMIC_MASKED_FA) {
			as->compare = htobe64(s->field_boundary); /* {add, field_boundary} */
			off += 16;
			break;
		}
		as->compare = htobe64(s->compare);
		off += 16;
		as = at(r, off); /* second segment: {swap_mask, compare_mask} */
		as->swap_add = htobe64(s->swap_add_mask);
		as->compare = htobe64(s->compare_mask);
		off += 16;
		break;
	}
	}
	if (s->inl_len) {
		struct mlx5_wqe_inl_data_seg *is = at(r, off);
		is->byte_count = htobe32(s->inl_len | MLX5_INLINE_SEG);
		put_bytes(r, off + sizeof(*is), s->inl, s->inl_len);
		off += (sizeof(*is) + s->inl_len + 15) & ~15u;
	}
	for (int i = 0; i < s->nsge; i++) {
		mlx5dv_set_data_seg(at(r, off), s->sge_bc[i], s->sge_lkey[i], s->sge_addr[i]);
		off += sizeof(struct mlx5_wqe_data_seg);
	}
	if (s->payload_len) {
		put_bytes(r, off, s->payload, s->payload_len);
		off += s->payload_len;
	}
	unsigned ds = s->ds ? (unsigned)s->ds : off / 16;
	mlx5dv_set_ctrl_seg(at(r, 0), s->idx, s->opcode, s->opmod, s->qpn, s->fm_ce_se, ds,
			    s->signature, s->imm);
	return ds;
}

static void print_hex(const char *key, const void *p, size_t n)
{
	const uint8_t *b = p;
	printf(" %s=", key);
	for (size_t i = 0; i < n; i++)
		printf("%02x", b[i]);
}

static void print_spec(const char *kind, const char *group, const struct wqe_spec *s, unsigned ds)
{
	printf("%s %s%s%s opcode=0x%02x opmod=0x%02x idx=0x%04x qpn=0x%06x ds=%u fm_ce_se=0x%02x "
	       "signature=0x%02x imm=0x%08x", kind, group ? group : "", group ? "." : "", s->name,
	       s->opcode, s->opmod, s->idx, s->qpn, ds, s->fm_ce_se, s->signature, be32toh(s->imm));
	if (s->has_raddr)
		printf(" raddr=0x%016llx rkey=0x%08x", (unsigned long long)s->raddr, s->rkey);
	if (s->amo != AMO_NONE) {
		static const char *kinds[] = { "", "plain", "masked_4b", "masked_8b", "masked_generic" };
		printf(" amo=%s swap_add=0x%llx compare=0x%llx swap_add_mask=0x%llx compare_mask=0x%llx "
		       "field_boundary=0x%llx", kinds[s->amo], (unsigned long long)s->swap_add,
		       (unsigned long long)s->compare, (unsigned long long)s->swap_add_mask,
		       (unsigned long long)s->compare_mask, (unsigned long long)s->field_boundary);
	}
	for (int i = 0; i < s->nsge; i++)
		printf(" sge%d=0x%x:0x%x:0x%llx", i, s->sge_bc[i], s->sge_lkey[i],
		       (unsigned long long)s->sge_addr[i]);
	if (s->inl_len)
		print_hex("inline", s->inl, s->inl_len);
	if (s->payload_len)
		print_hex("payload", s->payload, s->payload_len);
}

/* One standalone WQE: written at slot 0 of a 16-slot buffer, printed as DS*16 bytes. */
static void emit_wqe(const struct wqe_spec *s)
{
	uint8_t buf[16 * MLX5_SEND_WQE_BB];
	memset(buf, 0, sizeof(buf));
	struct ring r = { buf, 16, 0 };
	unsigned ds = write_wqe(&r, s);
	print_spec("wqe", NULL, s, ds);
	print_hex("hex", buf, ds * 16);
	printf("\n");
}

#define QPN 0x000123u /* ref §7 common parameters */
#define RADDR 0x00007f0012345678ull
#define RKEY 0x00abcdefu
#define LKEY 0x00001234u

static struct wqe_spec base(const char *name, uint8_t opcode, uint16_t idx)
{
	struct wqe_spec s;
	memset(&s, 0, sizeof(s));
	s.name = name;
	s.opcode = opcode;
	s.idx = idx;
	s.qpn = QPN;
	s.fm_ce_se = MLX5_WQE_CTRL_CQ_UPDATE;
	return s;
}

static void sge(struct wqe_spec *s, uint32_t bc, uint32_t lkey, uint64_t addr)
{
	s->sge_bc[s->nsge] = bc;
	s->sge_lkey[s->nsge] = lkey;
	s->sge_addr[s->nsge] = addr;
	s->nsge++;
}

static void remote(struct wqe_spec *s)
{
	s->has_raddr = 1;
	s->raddr = RADDR;
	s->rkey = RKEY;
}

static void inl(struct wqe_spec *s, int n, uint8_t seed)
{
	s->inl_len = n;
	for (int i = 0; i < n; i++)
		s->inl[i] = (uint8_t)(seed + 7 * i);
}

/* --- WQEs: every opcode of ref §2.1 and the compositions of ref §1.9 --- */
static void emit_wqes(void)
{
	struct wqe_spec s;

	s = base("rdma_write_v1", MLX5_OPCODE_RDMA_WRITE, 5); /* ref §7 V1 */
	remote(&s);
	sge(&s, 4096, LKEY, 0x7f00aabbcc00ull);
	emit_wqe(&s);

	s = base("rdma_write_2sge", MLX5_OPCODE_RDMA_WRITE, 0x1234);
	remote(&s);
	sge(&s, 100, LKEY, 0x1000);
	sge(&s, 0x7fffffff, 0xfedcba98, 0xffffffffffffff00ull);
	s.fm_ce_se = MLX5_WQE_CTRL_FENCE | MLX5_WQE_CTRL_CQ_UPDATE | MLX5_WQE_CTRL_SOLICITED;
	emit_wqe(&s);

	s = base("rdma_write_4sge_2wqebb", MLX5_OPCODE_RDMA_WRITE, 0x8000);
	remote(&s);
	for (int i = 0; i < 4; i++)
		sge(&s, 64u << i, LKEY + i, 0x200000ull * (i + 1));
	s.fm_ce_se = 0; /* unsignaled */
	emit_wqe(&s);

	s = base("rdma_write_imm_inline4_v2", MLX5_OPCODE_RDMA_WRITE_IMM, 6); /* ref §7 V2 */
	remote(&s);
	s.imm = htobe32(0xdeadbeef); /* verbs imm_data is network order; copied as given */
	{
		uint32_t v = 0x11223344; /* raw little-endian u32 payload, no swap */
		memcpy(s.inl, &v, 4);
		s.inl_len = 4;
	}
	emit_wqe(&s);

	s = base("rdma_write_inline12", MLX5_OPCODE_RDMA_WRITE, 0x00ff);
	remote(&s);
	inl(&s, 12, 0x30);
	emit_wqe(&s);

	s = base("rdma_write_inline40_2wqebb", MLX5_OPCODE_RDMA_WRITE, 0x0100);
	remote(&s);
	inl(&s, 40, 0x51);
	s.fm_ce_se = MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE | MLX5_WQE_CTRL_CQ_UPDATE;
	emit_wqe(&s);

	s = base("rdma_write_zero_length", MLX5_OPCODE_RDMA_WRITE_IMM, 0x0101);
	remote(&s);
	s.imm = htobe32(0x00000042);
	emit_wqe(&s);

	s = base("rdma_read_v6_idx_ffff", MLX5_OPCODE_RDMA_READ, 0xffff); /* ref §7 V6 */
	remote(&s);
	sge(&s, 8192, LKEY, 0x7f00aabbcc00ull);
	emit_wqe(&s);

	s = base("send_v8", MLX5_OPCODE_SEND, 0x000b); /* ref §7 V8 */
	s.fm_ce_se = MLX5_WQE_CTRL_SOLICITED | MLX5_WQE_CTRL_CQ_UPDATE;
	sge(&s, 0x100, LKEY, 0x7f00aabbcc00ull);
	emit_wqe(&s);

	s = base("send_3sge", MLX5_OPCODE_SEND, 0x0c00);
	sge(&s, 1, 1, 1);
	sge(&s, 2, 2, 2);
	sge(&s, 3, 3, 3);
	emit_wqe(&s);

	s = base("send_imm_inline7", MLX5_OPCODE_SEND_IMM, 0x0c01);
	s.imm = htobe32(0x01020304);
	inl(&s, 7, 0xa0);
	emit_wqe(&s);

	s = base("send_inval", MLX5_OPCODE_SEND_INVAL, 0x0c02);
	s.imm = htobe32(0x00beef01); /* rkey to invalidate, written BE32 (ref §1.2) */
	sge(&s, 512, LKEY, 0x4000);
	emit_wqe(&s);

	s = base("send_zero_length", MLX5_OPCODE_SEND, 0x0c03);
	emit_wqe(&s);

	s = base("atomic_cs_v5", MLX5_OPCODE_ATOMIC_CS, 9); /* ref §7 V5 */
	remote(&s);
	s.amo = AMO_PLAIN;
	s.swap_add = 0x10;
	s.compare = 0x20;
	sge(&s, 8, LKEY, 0x7f00aabb0000ull);
	emit_wqe(&s);

	s = base("atomic_fa_v4", MLX5_OPCODE_ATOMIC_FA, 8); /* ref §7 V4 */
	remote(&s);
	s.amo = AMO_PLAIN;
	s.swap_add = 5;
	sge(&s, 8, LKEY, 0x7f00aabb0000ull);
	emit_wqe(&s);

	s = base("masked_fa_4b_v3", MLX5_OPCODE_ATOMIC_MASKED_FA, 7); /* ref §7 V3, DeepEP */
	s.opmod = EXT_AMO_OPMOD_4B;
	s.has_raddr = 1;
	s.raddr = 0x00007f0000001000ull;
	s.rkey = RKEY;
	s.amo = AMO_MASKED_4B;
	s.swap_add = 1;
	sge(&s, 4, LKEY, 0x7f00aabb0000ull);
	emit_wqe(&s);

	s = base("masked_fa_4b_boundary", MLX5_OPCODE_ATOMIC_MASKED_FA, 0x4000);
	s.opmod = EXT_AMO_OPMOD_4B;
	remote(&s);
	s.amo = AMO_MASKED_4B;
	s.swap_add = 0xfffffffe;
	s.field_boundary = 0x80008000;
	sge(&s, 4, LKEY, 0x5000);
	emit_wqe(&s);

	s = base("masked_cs_4b", MLX5_OPCODE_ATOMIC_MASKED_CS, 0x4001);
	s.opmod = EXT_AMO_OPMOD_4B;
	remote(&s);
	s.amo = AMO_MASKED_4B;
	s.swap_add = 0xaabbccdd;
	s.compare = 0x11223344;
	s.swap_add_mask = 0xffffffff;
	s.compare_mask = 0x0000ffff;
	sge(&s, 4, LKEY, 0x5000);
	emit_wqe(&s);

	s = base("masked_fa_8b", MLX5_OPCODE_ATOMIC_MASKED_FA, 0x4002);
	s.opmod = EXT_AMO_OPMOD_8B;
	remote(&s);
	s.amo = AMO_MASKED_8B;
	s.swap_add = 0x0102030405060708ull;
	s.field_boundary = 0x8000000080000000ull;
	sge(&s, 8, LKEY, 0x5000);
	emit_wqe(&s);

	s = base("masked_cs_8b_v9_2wqebb", MLX5_OPCODE_ATOMIC_MASKED_CS, 0x000c); /* ref §7 V9 */
	s.opmod = EXT_AMO_OPMOD_8B;
	remote(&s);
	s.amo = AMO_MASKED_8B;
	s.swap_add = 0x1122334455667788ull;
	s.compare = 0;
	s.swap_add_mask = 0xffffffffffffffffull;
	s.compare_mask = 0;
	sge(&s, 8, LKEY, 0x7f00aabb0000ull);
	emit_wqe(&s);

	s = base("masked_cs_generic_opmod0", MLX5_OPCODE_ATOMIC_MASKED_CS, 0x4003);
	remote(&s);
	s.amo = AMO_MASKED_GENERIC;
	s.swap_add = 0xa5a5a5a5a5a5a5a5ull;
	s.compare = 0x5a5a5a5a5a5a5a5aull;
	s.swap_add_mask = 0x00000000ffffffffull;
	s.compare_mask = 0xffffffff00000000ull;
	sge(&s, 8, LKEY, 0x6000);
	emit_wqe(&s);

	s = base("masked_fa_generic_opmod0", MLX5_OPCODE_ATOMIC_MASKED_FA, 0x4004);
	remote(&s);
	s.amo = AMO_MASKED_GENERIC;
	s.swap_add = 3;
	s.compare = 0;
	s.swap_add_mask = 0x8000000000000000ull;
	s.compare_mask = 0;
	sge(&s, 8, LKEY, 0x6000);
	emit_wqe(&s);

	s = base("nop_doca_ds1", MLX5_OPCODE_NOP, 0x0009);
	emit_wqe(&s);

	s = base("nop_nvshmem_v7_ds2", MLX5_OPCODE_NOP, 0x000a); /* ref §7 V7 */
	s.ds = 2;
	emit_wqe(&s);

	s = base("dump_nvshmem", OP_DUMP, 0x0d00); /* ref §1.9: FM=FENCE (0x40), 1 byte */
	s.fm_ce_se = 0x40 | MLX5_WQE_CTRL_CQ_UPDATE;
	sge(&s, 1, LKEY, 0x7f00aabb0040ull);
	emit_wqe(&s);

	s = base("write_with_signature", MLX5_OPCODE_RDMA_WRITE, 0x0d01);
	remote(&s);
	sge(&s, 64, LKEY, 0x9000);
	s.signature = 0x5c;
	s.fm_ce_se = 0x60 | (3 << 2); /* strong ordering, CQE and EQE */
	emit_wqe(&s);

	/* Opcodes without a segment layout in the reference: ctrl + 16 opaque bytes. */
	static const struct {
		const char *name;
		uint8_t op;
	} opaque[] = {
		{ "tso", MLX5_OPCODE_TSO },
		{ "wait", OP_WAIT },
		{ "bind_mw", OP_BIND_MW },
		{ "fmr", MLX5_OPCODE_FMR },
		{ "local_inval", MLX5_OPCODE_LOCAL_INVAL },
		{ "config_cmd", MLX5_OPCODE_CONFIG_CMD },
		{ "set_psv", MLX5_OPCODE_SET_PSV },
		{ "get_psv", OP_GET_PSV },
		{ "check_psv", OP_CHECK_PSV },
		{ "umr", MLX5_OPCODE_UMR },
		{ "rget_psv", OP_RGET_PSV },
		{ "rcheck_psv", OP_RCHECK_PSV },
		{ "tag_matching", MLX5_OPCODE_TAG_MATCHING },
		{ "enhanced_mpsw", OP_ENHANCED_MPSW },
		{ "flow_tbl_access", MLX5_OPCODE_FLOW_TBL_ACCESS },
		{ "access_aso", OP_ACCESS_ASO },
		{ "mmo", MLX5_OPCODE_MMO },
	};
	for (unsigned i = 0; i < sizeof(opaque) / sizeof(opaque[0]); i++) {
		s = base(opaque[i].name, opaque[i].op, (uint16_t)(0xe000 + i));
		s.imm = htobe32(0x0badf000 + i); /* e.g. the UMR mkey */
		s.payload_len = 16;
		for (int j = 0; j < 16; j++)
			s.payload[j] = (uint8_t)(i * 16 + j);
		emit_wqe(&s);
	}
}

/* --- send-queue rings with wrap of the 16-bit index and of the ring --- */
static void emit_ring(const char *name, unsigned log_sq_size, uint16_t from_pi, struct wqe_spec *specs, int n)
{
	uint8_t buf[16 * MLX5_SEND_WQE_BB];
	unsigned nslots = 1u << log_sq_size;
	unsigned ds[8];
	uint16_t pi = from_pi;
	memset(buf, 0, sizeof(buf));
	for (int i = 0; i < n; i++) {
		struct ring r = { buf, nslots, pi & (nslots - 1) };
		specs[i].idx = pi;
		ds[i] = write_wqe(&r, &specs[i]);
		pi = (uint16_t)(pi + (ds[i] + 3) / 4);
	}
	printf("ring %s log_sq_size=%u from_pi=0x%04x to_pi=0x%04x", name, log_sq_size, from_pi, pi);
	print_hex("hex", buf, nslots * MLX5_SEND_WQE_BB);
	printf("\n");
	for (int i = 0; i < n; i++) {
		print_spec("ringwqe", name, &specs[i], ds[i]);
		printf("\n");
	}
	/* rdma-core rings the doorbell with the last WQE's first 8 ctrl bytes (ref §3.3) */
	struct ring last = { buf, nslots, specs[n - 1].idx & (nslots - 1) };
	uint64_t db;
	memcpy(&db, at(&last, 0), 8);
	printf("db %s.rdma_core convention=rdma-core pi=0x%04x qpn=0x%06x opcode=0x%02x opmod=0x%02x ds=%u "
	       "end=0x%04x u64=0x%016llx", name, specs[n - 1].idx, specs[n - 1].qpn, specs[n - 1].opcode,
	       specs[n - 1].opmod, ds[n - 1], pi, (unsigned long long)db);
	print_hex("hex", &db, 8);
	printf("\n");
}

static void emit_rings(void)
{
	struct wqe_spec w[5];

	/* 8 slots from 0xfffd: a 2-WQEBB masked CS at 0xffff sits in slot 7 and slot 0,
	 * crossing both the ring end and the 16-bit wrap. */
	w[0] = base("write", MLX5_OPCODE_RDMA_WRITE, 0);
	remote(&w[0]);
	sge(&w[0], 4096, LKEY, 0x10000);
	w[1] = base("send", MLX5_OPCODE_SEND, 0);
	sge(&w[1], 32, LKEY, 0x20000);
	w[2] = base("masked_cs_8b", MLX5_OPCODE_ATOMIC_MASKED_CS, 0);
	w[2].opmod = EXT_AMO_OPMOD_8B;
	remote(&w[2]);
	w[2].amo = AMO_MASKED_8B;
	w[2].swap_add = 0xabcdef;
	w[2].compare = 0x1234;
	w[2].swap_add_mask = ~0ull;
	w[2].compare_mask = ~0ull;
	sge(&w[2], 8, LKEY, 0x30000);
	w[3] = base("write_inline40", MLX5_OPCODE_RDMA_WRITE, 0);
	remote(&w[3]);
	inl(&w[3], 40, 0x11);
	w[4] = base("fa", MLX5_OPCODE_ATOMIC_FA, 0);
	remote(&w[4]);
	w[4].amo = AMO_PLAIN;
	w[4].swap_add = 1;
	sge(&w[4], 8, LKEY, 0x40000);
	emit_ring("wrap8", 3, 0xfffd, w, 5);

	/* 4 slots from 3: inline payload of a 2-WQEBB write runs from slot 3 into slot 0. */
	w[0] = base("write_inline44", MLX5_OPCODE_RDMA_WRITE_IMM, 0);
	remote(&w[0]);
	w[0].imm = htobe32(7);
	inl(&w[0], 44, 0x80);
	w[1] = base("nop", MLX5_OPCODE_NOP, 0);
	w[1].ds = 2;
	emit_ring("inline_wrap4", 2, 0x0003, w, 2);
}

/* --- CQEs (ref §2.2) --- */
static void emit_cqe(const char *name, const void *cqe, const char *params)
{
	printf("cqe %s %s", name, params);
	print_hex("hex", cqe, 64);
	printf("\n");
}

static void emit_cqes(void)
{
	struct mlx5_cqe64 c;
	struct mlx5_err_cqe e;
	char params[512];

	/* ref §7 C1: requester CQE for RDMA_WRITE, wqe_counter 5, owner 1 */
	memset(&c, 0, sizeof(c));
	c.sop_drop_qpn = htobe32((MLX5_OPCODE_RDMA_WRITE << 24) | QPN);
	c.wqe_counter = htobe16(5);
	c.op_own = MLX5_CQE_REQ << 4;
	mlx5dv_set_cqe_owner(&c, 1);
	snprintf(params, sizeof(params), "opcode=0x%x owner=0x%x format=0x%x se=0x%x qpn=0x%x send_opcode=0x%x "
		 "wqe_counter=0x%x byte_cnt=0x0 timestamp=0x0 user_index=0x0 signature=0x0",
		 mlx5dv_get_cqe_opcode(&c), mlx5dv_get_cqe_owner(&c), mlx5dv_get_cqe_format(&c),
		 mlx5dv_get_cqe_se(&c), QPN, MLX5_OPCODE_RDMA_WRITE, 5);
	emit_cqe("req_write_c1", &c, params);

	/* requester CQE for an RDMA_READ with byte count, timestamp, user index */
	memset(&c, 0, sizeof(c));
	c.srqn_uidx = htobe32(0x00abcdef);
	c.byte_cnt = htobe32(8192);
	c.timestamp = htobe64(0x0123456789abcdefull);
	c.sop_drop_qpn = htobe32((MLX5_OPCODE_RDMA_READ << 24) | 0xfedcba);
	c.wqe_counter = htobe16(0xffff);
	c.signature = 0x77;
	c.op_own = (MLX5_CQE_REQ << 4) | (2 << 2);
	mlx5dv_set_cqe_owner(&c, 0);
	snprintf(params, sizeof(params), "opcode=0x%x owner=0x%x format=0x%x se=0x%x qpn=0xfedcba send_opcode=0x%x "
		 "wqe_counter=0xffff byte_cnt=0x2000 timestamp=0x0123456789abcdef user_index=0xabcdef signature=0x77",
		 mlx5dv_get_cqe_opcode(&c), mlx5dv_get_cqe_owner(&c), mlx5dv_get_cqe_format(&c),
		 mlx5dv_get_cqe_se(&c), MLX5_OPCODE_RDMA_READ);
	emit_cqe("req_read", &c, params);

	/* responder CQE, solicited, immediate */
	memset(&c, 0, sizeof(c));
	c.imm_inval_pkey = htobe32(0xdeadbeef);
	c.byte_cnt = htobe32(100);
	c.sop_drop_qpn = htobe32(0x000456);
	c.wqe_counter = htobe16(0x0102);
	c.op_own = (MLX5_CQE_RESP_SEND_IMM << 4) | (1 << 1);
	mlx5dv_set_cqe_owner(&c, 1);
	snprintf(params, sizeof(params), "opcode=0x%x owner=0x%x format=0x%x se=0x%x qpn=0x456 send_opcode=0x0 "
		 "wqe_counter=0x102 byte_cnt=0x64 timestamp=0x0 user_index=0x0 signature=0x0 imm=0xdeadbeef",
		 mlx5dv_get_cqe_opcode(&c), mlx5dv_get_cqe_owner(&c), mlx5dv_get_cqe_format(&c),
		 mlx5dv_get_cqe_se(&c));
	emit_cqe("resp_send_imm", &c, params);

	/* ref §7 C2: REQ_ERR, transport retry exceeded, vendor 0x81, wqe_counter 6 */
	memset(&e, 0, sizeof(e));
	e.srqn = htobe32(0x000007);
	e.vendor_err_synd = 0x81;
	e.syndrome = MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR;
	e.s_wqe_opcode_qpn = htobe32((MLX5_OPCODE_RDMA_WRITE_IMM << 24) | QPN);
	e.wqe_counter = htobe16(6);
	e.op_own = MLX5_CQE_REQ_ERR << 4;
	snprintf(params, sizeof(params), "opcode=0x%x owner=0x0 format=0x0 se=0x0 qpn=0x%x send_opcode=0x%x "
		 "wqe_counter=0x6 user_index=0x7 signature=0x0 syndrome=0x%x vendor_err_synd=0x81",
		 MLX5_CQE_REQ_ERR, QPN, MLX5_OPCODE_RDMA_WRITE_IMM, MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR);
	emit_cqe("req_err_c2", &e, params);

	/* flush error on the responder side, owner 1 */
	memset(&e, 0, sizeof(e));
	e.syndrome = MLX5_CQE_SYNDROME_WR_FLUSH_ERR;
	e.s_wqe_opcode_qpn = htobe32(0x000999);
	e.wqe_counter = htobe16(0x8000);
	e.op_own = (MLX5_CQE_RESP_ERR << 4) | 1;
	snprintf(params, sizeof(params), "opcode=0x%x owner=0x1 format=0x0 se=0x0 qpn=0x999 send_opcode=0x0 "
		 "wqe_counter=0x8000 user_index=0x0 signature=0x0 syndrome=0x%x vendor_err_synd=0x0",
		 MLX5_CQE_RESP_ERR, MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
	emit_cqe("resp_err_flush", &e, params);

	/* ref §7 C3: NVSHMEM pre-fills CQ rings with 0xff: opcode INVALID */
	memset(&c, 0xff, sizeof(c));
	snprintf(params, sizeof(params), "opcode=0x%x owner=0x1 format=0x3 se=0x1 qpn=0xffffff send_opcode=0xff "
		 "wqe_counter=0xffff byte_cnt=0xffffffff timestamp=0xffffffffffffffff user_index=0xffffff "
		 "signature=0xff", MLX5_CQE_INVALID);
	emit_cqe("invalid_ff_c3", &c, params);
}

/* --- doorbells and doorbell records (ref §3.1, §3.3) --- */
static void emit_db(const char *name, const char *conv, unsigned long long pi, uint32_t qpn, uint32_t w0,
		    uint32_t w1, unsigned end)
{
	uint32_t words[2] = { w0, w1 };
	uint64_t u64;
	memcpy(&u64, words, 8);
	printf("db %s convention=%s pi=0x%llx qpn=0x%06x end=0x%04x u64=0x%016llx", name, conv, pi, qpn, end,
	       (unsigned long long)u64);
	print_hex("hex", words, 8);
	printf("\n");
}

static void emit_doorbells(void)
{
	static const unsigned long long pis[] = { 0x10006, 0x0000, 0xffff, 0x1fffe, 0x123456 };
	for (unsigned i = 0; i < sizeof(pis) / sizeof(pis[0]); i++) {
		char name[64];
		unsigned long long pi = pis[i];
		/* NVSHMEM / DeepEP GPU: {BE32((u16)pi << 8), BE32(qpn << 8)} */
		snprintf(name, sizeof(name), "nvshmem_%llx", pi);
		emit_db(name, "nvshmem", pi, QPN, htobe32((uint32_t)(uint16_t)pi << 8), htobe32(QPN << 8),
			(unsigned)(pi & 0xffff));
		/* DOCA / NVSHMEM CPU proxy: BE32((u32)(pi64 << 8)) */
		snprintf(name, sizeof(name), "doca_%llx", pi);
		emit_db(name, "doca", pi, QPN, htobe32((uint32_t)(pi << 8)), htobe32(QPN << 8), (unsigned)(pi & 0xffff));
		/* rdma-core DBR: htobe32(cur_post & 0xffff) at DBR+4 */
		uint32_t dbr = htobe32((uint32_t)(pi & 0xffff));
		printf("dbr dbr_%llx pi=0x%llx", pi, pi);
		print_hex("hex", &dbr, 4);
		printf("\n");
	}
	/* rdma-core after posting only V1 (ref §7 DB3): first 8 ctrl bytes of that WQE */
	struct mlx5_wqe_ctrl_seg ctrl;
	mlx5dv_set_ctrl_seg(&ctrl, 5, MLX5_OPCODE_RDMA_WRITE, 0, QPN, MLX5_WQE_CTRL_CQ_UPDATE, 3, 0, 0);
	uint64_t u64;
	memcpy(&u64, &ctrl, 8); /* post_send_db: mmio_write64_be(reg, *(__be64 *)ctrl) */
	printf("db rdma_core_v1_db3 convention=rdma-core pi=0x0005 qpn=0x%06x opcode=0x%02x opmod=0x00 ds=3 "
	       "end=0x0006 u64=0x%016llx", QPN, MLX5_OPCODE_RDMA_WRITE, (unsigned long long)u64);
	print_hex("hex", &ctrl, 8);
	printf("\n");
}

/* --- PRM command buffers written with the header's _devx_set/_devx_set64 (ref §0) --- */
struct prm_val {
	const char *name;
	unsigned bit_off, width;
	unsigned long long value;
};

static void emit_prm(const char *kind, const char *name, size_t size, const struct prm_val *v, int n)
{
	uint8_t buf[512];
	memset(buf, 0, sizeof(buf));
	printf("%s %s size=%zu", kind, name, size);
	for (int i = 0; i < n; i++) {
		if (v[i].width == 64)
			_devx_set64(buf, v[i].value, v[i].bit_off);
		else
			_devx_set(buf, (uint32_t)v[i].value, v[i].bit_off, v[i].width);
		printf(" %s=0x%llx", v[i].name, v[i].value);
	}
	print_hex("hex", buf, size);
	printf("\n");
}

static void emit_prms(void)
{
	/* Offsets: ref §4.3 (create_qp_in, qpc at bit 0xc0), §4.4 (modify), §4.5 (create_cq). */
	static const struct prm_val create_qp[] = {
		{ "opcode", 0x000, 16, 0x500 }, { "uid", 0x010, 16, 0x1234 }, { "op_mod", 0x030, 16, 0 },
		{ "st", 0x0c8, 8, 0x5 }, { "pm_state", 0x0d3, 2, 3 }, { "pd", 0x0e8, 24, 0xabcdef },
		{ "log_rq_size", 0x109, 4, 10 }, { "log_rq_stride", 0x10d, 3, 0 }, { "log_sq_size", 0x111, 4, 15 },
		{ "uar_page", 0x128, 24, 0x123456 }, { "user_index", 0x148, 24, 0xfffffe },
		{ "cqn_snd", 0x4a8, 24, 0x789 }, { "cqn_rcv", 0x5a8, 24, 0x78a },
		{ "dbr_addr", 0x5c0, 64, 0x0000000100000040ull }, { "rq_type", 0x625, 3, 0 },
		{ "srqn_rmpn_xrqn", 0x628, 24, 0x456 }, { "dbr_umem_valid", 0x743, 1, 1 },
		{ "dbr_umem_id", 0x7e0, 32, 0x80000012 }, { "wq_umem_offset", 0x800, 64, 0x10000 },
		{ "wq_umem_id", 0x840, 32, 0x11 }, { "wq_umem_valid", 0x860, 1, 1 },
	};
	emit_prm("prm_create_qp_in", "deepep_like", 272, create_qp, sizeof(create_qp) / sizeof(create_qp[0]));
	static const struct prm_val create_qp_out[] = {
		{ "status", 0x00, 8, 0 }, { "syndrome", 0x20, 32, 0x0 }, { "qpn", 0x48, 24, 0xabc123 },
	};
	emit_prm("prm_create_qp_out", "deepep_like", 16, create_qp_out, 3);
	static const struct prm_val init2rtr[] = {
		{ "opcode", 0x000, 16, 0x503 }, { "qpn", 0x048, 24, 0xabc123 }, { "mtu", 0x100, 3, 5 },
		{ "log_msg_max", 0x103, 5, 30 }, { "remote_qpn", 0x168, 24, 0x654321 },
		{ "rlid", 0x1b0, 16, 0xbeef }, { "sl", 0x2a4, 4, 0xf }, { "min_rnr_nak", 0x563, 5, 12 },
		{ "log_rra_max", 0x548, 3, 4 }, { "next_rcv_psn", 0x568, 24, 0xffffff }, { "grh", 0x1a8, 1, 1 },
		{ "vhca_port_num", 0x2a8, 8, 1 },
	};
	emit_prm("prm_modify_qp_in", "init2rtr", 272, init2rtr, sizeof(init2rtr) / sizeof(init2rtr[0]));
	static const struct prm_val rtr2rts[] = {
		{ "opcode", 0x000, 16, 0x504 }, { "qpn", 0x048, 24, 0x000001 }, { "next_send_psn", 0x488, 24, 0xabcdef },
		{ "retry_count", 0x44d, 3, 7 }, { "rnr_retry", 0x450, 3, 7 }, { "ack_timeout", 0x1c0, 5, 20 },
		{ "log_sra_max", 0x448, 3, 5 }, { "log_ack_req_freq", 0x440, 4, 0 },
	};
	emit_prm("prm_modify_qp_in", "rtr2rts", 272, rtr2rts, sizeof(rtr2rts) / sizeof(rtr2rts[0]));
	static const struct prm_val rst2init[] = {
		{ "opcode", 0x000, 16, 0x502 }, { "qpn", 0x048, 24, 0x000abc }, { "rre", 0x550, 1, 1 },
		{ "rwe", 0x551, 1, 1 }, { "rae", 0x552, 1, 1 }, { "atomic_mode", 0x54c, 4, 3 },
		{ "pm_state", 0x0d3, 2, 3 }, { "pkey_index", 0x190, 16, 0 }, { "vhca_port_num", 0x2a8, 8, 1 },
	};
	emit_prm("prm_modify_qp_in", "rst2init", 272, rst2init, sizeof(rst2init) / sizeof(rst2init[0]));
	static const struct prm_val create_cq[] = {
		{ "opcode", 0x000, 16, 0x400 }, { "dbr_umem_valid", 0x086, 1, 1 }, { "cqe_sz", 0x088, 3, 0 },
		{ "cc", 0x08b, 1, 1 }, { "oi", 0x08e, 1, 1 }, { "dbr_umem_id", 0x0a0, 32, 0x21 },
		{ "log_cq_size", 0x0e3, 5, 10 }, { "uar_page", 0x0e8, 24, 0x123 }, { "c_eqn", 0x138, 8, 0x17 },
		{ "log_page_size", 0x143, 5, 4 }, { "dbr_addr", 0x240, 64, 0 },
		{ "cq_umem_offset", 0x280, 64, 0x2000 }, { "cq_umem_id", 0x2c0, 32, 0x20 },
		{ "cq_umem_valid", 0x2e0, 1, 1 },
	};
	emit_prm("prm_create_cq_in", "nvshmem_like", 96, create_cq, sizeof(create_cq) / sizeof(create_cq[0]));
}

int main(void)
{
	emit_wqes();
	emit_rings();
	emit_cqes();
	emit_doorbells();
	emit_prms();
	return 0;
}
