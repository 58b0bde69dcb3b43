/*
 * Configuration from SIGMATRACE_* environment variables.
 *
 * Read once at load time (constructor).  A bad value never stops the traced
 * program: it is reported on one stderr line and replaced by the default.
 * No allocation here: this runs before anything else in the library.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core.h"

struct st_config st_cfg = {
	.enabled = 1,
	.mode = ST_MODE_SIMPLE,
	.providers = ST_PROV_ALL,
	.output_dir = ".",
	.chunk_bytes = 64 * 1024,
	.chunks = 64,
	.drop_policy = ST_DROP_NEWEST,
	.batch_threshold = 128,
	.flush_ms = 100,
	.calib_ms = 1000,
	.signals = 1,
	.eager = 0,
	.writer_process = 2, /* the consumer process (procwriter.c): no thread in the traced process; 2: by default, so a
			      * consumer that cannot start means the writer thread without a word (1: asked for, said) */
	.side_kb = 4096,
	.test_writer_delay_ms = 0,
};

static const char *const mode_names[] = {"aggregate", "simple", "full"};
static const char *const provider_names[] = {"ibv", "mlx5", "cuda", "ucx", "ofi", "nccl"};
#define N_PROVIDERS (sizeof(provider_names) / sizeof(provider_names[0]))

const char *st_mode_name(int mode)
{
	return (mode >= 0 && mode <= 2) ? mode_names[mode] : "simple";
}

const char *st_provider_name(unsigned bit)
{
	for (unsigned i = 0; i < N_PROVIDERS; i++)
		if (bit == (1u << i))
			return provider_names[i];
	return "?";
}

void st_warn(const char *fmt, ...)
{
	char line[512];
	int n = snprintf(line, sizeof(line), "sigmatrace: ");
	va_list ap;
	va_start(ap, fmt);
	n += vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	line[n++] = '\n';
	int saved = errno;
	ssize_t r = write(2, line, (size_t)n);
	(void)r;
	errno = saved;
}

/* Parse an unsigned decimal in [lo, hi]; on error warn and keep *out. */
static void env_uint(const char *name, uint32_t lo, uint32_t hi, uint32_t *out)
{
	const char *v = getenv(name);
	if (!v || !*v)
		return;
	char *end;
	errno = 0;
	unsigned long long x = strtoull(v, &end, 10);
	if (errno || *end || v[0] == '-' || x < lo || x > hi) {
		st_warn("%s=\"%.64s\" is not an integer in [%u, %u]; using %u", name, v, lo, hi, *out);
		return;
	}
	*out = (uint32_t)x;
}

static void env_bool(const char *name, int *out)
{
	const char *v = getenv(name);
	if (!v || !*v)
		return;
	if (!strcmp(v, "1") || !strcasecmp(v, "yes") || !strcasecmp(v, "true") || !strcasecmp(v, "on"))
		*out = 1;
	else if (!strcmp(v, "0") || !strcasecmp(v, "no") || !strcasecmp(v, "false") || !strcasecmp(v, "off"))
		*out = 0;
	else
		st_warn("%s=\"%.64s\" is not a boolean (0/1); using %d", name, v, *out);
}

static void parse_providers(const char *v)
{
	/* "all", "none" or a comma list of names; unknown names are reported and skipped. */
	if (!strcasecmp(v, "all")) {
		st_cfg.providers = ST_PROV_ALL;
		return;
	}
	unsigned mask = 0;
	int bad = 0;
	char tok[32];
	const char *p = v;
	while (*p) {
		size_t n = strcspn(p, ", ");
		if (n > 0) {
			int found = 0;
			if (n < sizeof(tok)) {
				memcpy(tok, p, n);
				tok[n] = 0;
				if (!strcasecmp(tok, "none"))
					found = 1;
				for (unsigned i = 0; i < N_PROVIDERS && !found; i++)
					if (!strcasecmp(tok, provider_names[i]) ||
					    (i == 0 && !strcasecmp(tok, "ibverbs")) ||
					    (i == 1 && !strcasecmp(tok, "mlx5dv")) ||
					    (i == 4 && !strcasecmp(tok, "libfabric"))) {
						mask |= 1u << i;
						found = 1;
					}
			}
			if (!found)
				bad = 1;
		}
		p += n;
		while (*p == ',' || *p == ' ')
			p++;
	}
	if (bad && !mask) {
		st_warn("SIGMATRACE_PROVIDERS=\"%.64s\" names no known provider (ibv,mlx5,cuda,ucx,ofi,nccl,all,none); using all", v);
		mask = ST_PROV_ALL;
	} else if (bad) {
		st_warn("SIGMATRACE_PROVIDERS=\"%.64s\": unknown names ignored (known: ibv,mlx5,cuda,ucx,ofi,nccl,all,none)", v);
	}
	st_cfg.providers = mask;
}

void st_config_load(void)
{
	const char *v;

	{
		int dis = 0;
		env_bool("SIGMATRACE_DISABLE", &dis);
		st_cfg.enabled = !dis;
	}

	v = getenv("SIGMATRACE_MODE");
	if (v && *v) {
		int m = -1;
		for (int i = 0; i < 3; i++)
			if (!strcasecmp(v, mode_names[i]))
				m = i;
		if (!strcasecmp(v, "agg"))
			m = ST_MODE_AGGREGATE;
		if (m < 0)
			st_warn("SIGMATRACE_MODE=\"%.64s\" is not one of aggregate|simple|full; using simple", v);
		else
			st_cfg.mode = m;
	}

	v = getenv("SIGMATRACE_PROVIDERS");
	if (v && *v)
		parse_providers(v);

	v = getenv("SIGMATRACE_OUTPUT_DIR");
	if (v && *v) {
		if (strlen(v) >= sizeof(st_cfg.output_dir) - 128)
			st_warn("SIGMATRACE_OUTPUT_DIR is too long (%zu bytes); using \".\"", strlen(v));
		else
			strcpy(st_cfg.output_dir, v);
	}

	uint32_t kb = st_cfg.chunk_bytes / 1024;
	env_uint("SIGMATRACE_BUFFER_KB", 1, 16384, &kb);
	st_cfg.chunk_bytes = kb * 1024;
	env_uint("SIGMATRACE_CHUNKS", 2, 4096, &st_cfg.chunks);

	v = getenv("SIGMATRACE_DROP_POLICY");
	if (v && *v) {
		if (!strcasecmp(v, "drop") || !strcasecmp(v, "drop-newest"))
			st_cfg.drop_policy = ST_DROP_NEWEST;
		else if (!strcasecmp(v, "block"))
			st_cfg.drop_policy = ST_DROP_BLOCK;
		else
			st_warn("SIGMATRACE_DROP_POLICY=\"%.64s\" is not one of drop|block; using drop", v);
	}

	env_uint("SIGMATRACE_BATCH_THRESHOLD", 1, 1u << 20, &st_cfg.batch_threshold);
	env_uint("SIGMATRACE_FLUSH_MS", 1, 600000, &st_cfg.flush_ms);
	env_uint("SIGMATRACE_CALIB_MS", 10, 3600000, &st_cfg.calib_ms);
	env_bool("SIGMATRACE_SIGNALS", &st_cfg.signals);
	env_bool("SIGMATRACE_EAGER", &st_cfg.eager);
	v = getenv("SIGMATRACE_WRITER");
	if (v && *v) {
		if (!strcasecmp(v, "thread"))
			st_cfg.writer_process = 0;
		else if (!strcasecmp(v, "process"))
			st_cfg.writer_process = 1;
		else
			st_warn("SIGMATRACE_WRITER=\"%.64s\" is not one of thread|process; using process", v);
	}
	v = getenv("SIGMATRACE_IDLE_POLLS");
	if (v && *v) {
		if (!strcasecmp(v, "coalesce"))
			st_cfg.idle_polls_each = 0;
		else if (!strcasecmp(v, "each"))
			st_cfg.idle_polls_each = 1;
		else
			st_warn("SIGMATRACE_IDLE_POLLS=\"%.64s\" is not one of coalesce|each; using coalesce", v);
	}
	env_uint("SIGMATRACE_SIDE_KB", 16, 16384, &st_cfg.side_kb); /* a SIDE chunk holds at most 16 MiB */
	/* test hook (a slow disk): never set it otherwise */
	env_uint("SIGMATRACE_TEST_WRITER_DELAY_MS", 0, 10000, &st_cfg.test_writer_delay_ms);

	v = getenv("SIGMATRACE_NODE_ID");
	if (v && *v) {
		if (strlen(v) >= sizeof(st_cfg.node_id))
			st_warn("SIGMATRACE_NODE_ID is too long; using the host name");
		else
			strcpy(st_cfg.node_id, v);
	}
	v = getenv("SIGMATRACE_LAUNCHER");
	if (v && *v && strlen(v) < sizeof(st_cfg.launcher))
		strcpy(st_cfg.launcher, v);
}
