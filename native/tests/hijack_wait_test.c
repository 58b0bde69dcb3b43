/* hijack_wait_test -- the order of the poller's monitor/wait idle wait
 * (hijack/arch.h monitor_wait, issue finding 7), with fake instructions.
 *
 * UMWAIT and MWAITX end when the monitored cache line is written after the
 * monitor was armed; a write that lands between the poller's last scan and
 * the arm does not end the wait.  monitor_wait must therefore arm, read the
 * word again, and wait only if it still holds the value the scan saw.  The
 * fakes record the calls; the arm can "land a doorbell" at the moment the
 * monitor is armed (the write an unchecked wait would sleep through).
 * Runs anywhere: the real instructions are not used (most VMs hide them).
 * Prints "WAIT TEST OK" (exit 0) or the failing case (exit 1).
 */
#include <stdio.h>
#include <string.h>

#include "hijack/arch.h"

static volatile uint64_t word;
static char calls[8];
static int ncalls, write_at_arm;

static void fake_arm(const volatile void *a)
{
	calls[ncalls++] = 'A';
	if (a != (const volatile void *)&word)
		calls[ncalls++] = '?';
	if (write_at_arm)
		word = 2; /* a doorbell rung just as the monitor is armed */
}

static void fake_wait(uint64_t ticks)
{
	(void)ticks;
	calls[ncalls++] = 'W';
}

static const struct monitor_ops fake = {fake_arm, fake_wait};

static int run(const char *name, uint64_t before, int at_arm, int want_ret, const char *want_calls)
{
	word = before;
	write_at_arm = at_arm;
	ncalls = 0;
	memset(calls, 0, sizeof calls);
	int r = monitor_wait(&fake, &word, 1, 1000);
	if (r != want_ret || strcmp(calls, want_calls)) {
		printf("FAIL %s: returned %d calls \"%s\" (want %d \"%s\")\n", name, r, calls, want_ret, want_calls);
		return 1;
	}
	printf("ok %s: calls \"%s\"\n", name, calls);
	return 0;
}

int main(void)
{
	int fails = 0;
	/* nothing new: arm, then wait */
	fails += run("idle", 1, 0, 0, "AW");
	/* rung after the scan, before the arm: no wait at all */
	fails += run("rung_before_arm", 2, 0, 1, "A");
	/* rung while arming: the re-read after the arm sees it */
	fails += run("rung_at_arm", 1, 1, 1, "A");
	printf(fails ? "WAIT TEST FAIL\n" : "WAIT TEST OK\n");
	return fails != 0;
}
