/* result_fail.h -- the last line of the test clients that end with "RESULT OK" or "RESULT FAIL <why>"
 * (load_order_*.c, trace_dlopen_verbs.c): RESULT_FAIL(fmt, ...) prints the failure and returns 1 from
 * the calling function. */
#ifndef SIGMATRACE_TESTS_RESULT_FAIL_H
#define SIGMATRACE_TESTS_RESULT_FAIL_H

#include <stdio.h>

#define RESULT_FAIL(...)                       \
	do {                                   \
		printf("RESULT FAIL ");        \
		printf(__VA_ARGS__);           \
		printf("\n");                  \
		return 1;                      \
	} while (0)

#endif
