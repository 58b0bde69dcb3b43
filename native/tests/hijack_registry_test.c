/* hijack_registry_test -- the hijack's QP records over many QPs' lifetimes
 * (issue 12, finding 4).  Built with registry.c itself (no tracer around it).
 *
 * A real HCA hands out QP numbers from a 24-bit space and does not reuse a
 * number soon, so a process that creates and destroys QPs for long meets far
 * more distinct numbers than the record table has slots.  Here 20,000
 * distinct QPNs are noted and forgotten (every 100th kept alive), then 300
 * more noted: every live record must be found with its own fields.
 * Prints "REGISTRY TEST OK" (exit 0) or what failed (exit 1).
 */
#include <stdio.h>

#include "hijack/registry.c"

/* what registry.c asks of page.c (the teardown handshake): no pollers here */
void hijack_pages_of_uar(uint32_t uar_page, unsigned char *want)
{
	(void)uar_page;
	(void)want;
}
void hijack_sync_pages(const unsigned char *want)
{
	(void)want;
}

static int check(uint32_t qpn, uint32_t log_sq)
{
	struct qp_rec *q = hijack_qp_slot(qpn, 0);
	return q && q->qpn == qpn && __atomic_load_n(&q->live, __ATOMIC_ACQUIRE) && q->log_sq == log_sq;
}

int main(void)
{
	int fails = 0, not_recorded = 0, still_found = 0, live_lost = 0, late_lost = 0;
	uint32_t kept[300], nkept = 0;
	for (uint32_t i = 0; i < 20000; i++) {
		uint32_t qpn = 0x100 + i * 7;
		st_hijack_note_qp(qpn, 1, 0xC0000000u | i, 0, 4 + (i % 8), 0xD0000000u | i, 0);
		if (!check(qpn, 4 + (i % 8))) {
			if (not_recorded++ < 3)
				printf("FAIL QP %u (qpn 0x%x) not recorded\n", i, qpn);
			continue;
		}
		if (i % 100 == 0 && nkept < 300)
			kept[nkept++] = qpn;
		else
			st_hijack_forget_qp(qpn);
		struct qp_rec *q = hijack_qp_slot(qpn, 0);
		if (i % 100 && q && __atomic_load_n(&q->live, __ATOMIC_ACQUIRE) && still_found++ < 3)
			printf("FAIL QP %u (qpn 0x%x) still live after forget\n", i, qpn);
	}
	for (uint32_t k = 0; k < nkept; k++) {
		uint32_t i = (kept[k] - 0x100) / 7;
		if (!check(kept[k], 4 + (i % 8)) && live_lost++ < 3)
			printf("FAIL live QP 0x%x lost\n", kept[k]);
	}
	for (uint32_t i = 0; i < 300; i++) {
		uint32_t qpn = 0x800000 + i;
		st_hijack_note_qp(qpn, 1, 0xC0000000u | i, 0, 6, 0xD0000000u | i, 0);
		if (!check(qpn, 6) && late_lost++ < 3)
			printf("FAIL late QP 0x%x not recorded\n", qpn);
	}
	unsigned used = 0;
	for (uint32_t i = 0; i < QP_SLOTS; i++)
		used += qps[i].qpn != 0;
	printf("slots in use at the end: %u of %u (live %u)\n", used, QP_SLOTS, nkept + 300);
	printf("not_recorded=%d still_live=%d live_lost=%d late_not_recorded=%d\n", not_recorded, still_found, live_lost,
	       late_lost);
	fails = not_recorded + still_found + live_lost + late_lost;
	printf(fails ? "REGISTRY TEST FAIL (%d)\n" : "REGISTRY TEST OK\n", fails);
	return fails != 0;
}
