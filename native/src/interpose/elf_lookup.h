/*
 * A function's address in one loaded object, read from the object's own
 * dynamic symbol table (GNU hash, or the SysV hash table when it has no GNU
 * one).  No allocation, no lock, no call into libc or the dynamic linker, so
 * it is safe anywhere: while a sanitizer runtime initialises (dlsym.c finds
 * libc's dlsym with it) and inside a dl_iterate_phdr callback, where the
 * loader's lock is held (resolve.c finds a traced library's real functions
 * with it).
 *
 * The definition taken is the one an unversioned dlsym() would return: the
 * default version (name@@V, or unversioned); a name defined only in hidden
 * (non-default, name@V) versions gives that definition.
 */
#ifndef ST_INTERPOSE_ELF_LOOKUP_H
#define ST_INTERPOSE_ELF_LOOKUP_H

#include <elf.h>
#include <link.h>
#include <stdint.h>

struct st_elf_want {
	const char *sym; /* in */
	void *result;    /* out: the definition's address (an IFUNC's resolver when ifunc) */
	int ifunc;       /* out: STT_GNU_IFUNC: the address is not the function yet */
};

/* No libc string calls here: a sanitizer runtime intercepts them and is not ready yet when it
 * calls our dlsym during its own initialisation. */
static inline int st_elf_same_name(const char *a, const char *b)
{
	while (*a && *a == *b)
		a++, b++;
	return *a == *b;
}

static inline uint32_t st_elf_gnu_hash(const char *s)
{
	uint32_t h = 5381;
	for (const unsigned char *p = (const unsigned char *)s; *p; p++)
		h = h * 33 + *p;
	return h;
}

/* One loaded object (load base, dynamic section): 1 and want->result when it defines want->sym. */
static inline int st_elf_lookup(const ElfW(Dyn) *dyn, ElfW(Addr) base, struct st_elf_want *want)
{
	if (!dyn)
		return 0;
	ElfW(Addr) symtab = 0, strtab = 0, gnuhash = 0, hash = 0, versym = 0;
	for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; d++) {
		switch (d->d_tag) {
		case DT_SYMTAB: symtab = d->d_un.d_ptr; break;
		case DT_STRTAB: strtab = d->d_un.d_ptr; break;
		case DT_GNU_HASH: gnuhash = d->d_un.d_ptr; break;
		case DT_HASH: hash = d->d_un.d_ptr; break;
		case DT_VERSYM: versym = d->d_un.d_ptr; break;
		}
	}
	/* the dynamic linker relocates these in place on most targets, not all (and not yet in an object
	 * being loaded) */
#define FIX(p) ((p) && (p) < base ? (p) + base : (p))
	symtab = FIX(symtab);
	strtab = FIX(strtab);
	gnuhash = FIX(gnuhash);
	hash = FIX(hash);
	versym = FIX(versym);
#undef FIX
	if (!symtab || !strtab)
		return 0;
	const ElfW(Sym) *syms = (const ElfW(Sym) *)symtab;
	const char *strs = (const char *)strtab;
	const ElfW(Half) *versions = (const ElfW(Half) *)versym;
	void *hidden_match = NULL;
	int hidden_ifunc = 0;

#define CONSIDER(idx)                                                                                       \
	do {                                                                                                \
		const ElfW(Sym) *sym_ = &syms[idx];                                                         \
		unsigned type_ = ELF64_ST_TYPE(sym_->st_info);                                              \
		if (sym_->st_value && sym_->st_shndx != SHN_UNDEF &&                                        \
		    (type_ == STT_FUNC || type_ == STT_GNU_IFUNC) && st_elf_same_name(strs + sym_->st_name, want->sym)) { \
			void *addr_ = (void *)(base + sym_->st_value);                                      \
			if (versions && (versions[idx] & 0x8000)) {                                         \
				hidden_match = addr_;                                                       \
				hidden_ifunc = type_ == STT_GNU_IFUNC;                                      \
			} else {                                                                            \
				want->result = addr_;                                                       \
				want->ifunc = type_ == STT_GNU_IFUNC;                                       \
				return 1;                                                                   \
			}                                                                                   \
		}                                                                                           \
	} while (0)

	if (gnuhash) {
		const uint32_t *h = (const uint32_t *)gnuhash;
		uint32_t nbuckets = h[0], symoffset = h[1], bloom_size = h[2];
		const ElfW(Addr) *bloom = (const ElfW(Addr) *)&h[4];
		const uint32_t *buckets = (const uint32_t *)&bloom[bloom_size];
		const uint32_t *chain = &buckets[nbuckets];
		uint32_t hv = st_elf_gnu_hash(want->sym);
		uint32_t idx = nbuckets ? buckets[hv % nbuckets] : 0;
		if (idx >= symoffset) {
			for (;;) {
				uint32_t h2 = chain[idx - symoffset];
				if ((hv | 1) == (h2 | 1))
					CONSIDER(idx);
				if (h2 & 1)
					break;
				idx++;
			}
		}
	} else if (hash) {
		const uint32_t *h = (const uint32_t *)hash;
		uint32_t nchain = h[1];
		for (uint32_t idx = 0; idx < nchain; idx++)
			CONSIDER(idx);
	}
#undef CONSIDER
	if (hidden_match) {
		want->result = hidden_match;
		want->ifunc = hidden_ifunc;
		return 1;
	}
	return 0;
}

#endif /* ST_INTERPOSE_ELF_LOOKUP_H */
