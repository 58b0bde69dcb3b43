/* libibverbs.so.1 of the emulated HCA: asynchronous events.  The emulator
 * raises none (docs/emulator.md, Limits). */
#include <unistd.h>

#include "emu_internal.h"

/* ---- async events ----------------------------------------------------------- */
EXPORT int ibv_get_async_event(struct ibv_context *c, struct ibv_async_event *ev)
{
	char b;
	/* no async events are generated; block like the real call until the fd closes */
	if (read(c->async_fd, &b, 1) <= 0)
		return -1;
	return -1;
}
EXPORT void ibv_ack_async_event(struct ibv_async_event *ev) {}
