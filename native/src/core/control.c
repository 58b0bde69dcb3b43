/* Public control API (include/sigmatrace/control.h). */
#include <string.h>

#include "core.h"
#include "sigmatrace/control.h"

ST_EXPORT int sigmatrace_active(void)
{
	return st_cfg.enabled && __atomic_load_n(&st_active, __ATOMIC_ACQUIRE);
}

ST_EXPORT void sigmatrace_mark(const char *text)
{
	static uint32_t next_mark = 1;
	if (!st_cfg.enabled || !text)
		return;
	uint64_t sid = st_side_add(ST_SIDE_STRING, text, strnlen(text, 65536), NULL, 0, NULL, 0);
	st_ev(ST_EV_MARK, 0, __atomic_fetch_add(&next_mark, 1, __ATOMIC_RELAXED), sid);
}

ST_EXPORT void sigmatrace_flush(void)
{
	if (!sigmatrace_active())
		return;
	st_writer_kick();
}

