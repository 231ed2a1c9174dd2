/*
 * common/check.h: assertions for programming errors only (broken invariants).
 * Runtime conditions (bad input, missing files, CUDA errors) are statuses.
 */
#ifndef DSV4_COMMON_CHECK_H
#define DSV4_COMMON_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond)                                                                     \
	do {                                                                            \
		if (!(cond)) {                                                          \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
			abort();                                                        \
		}                                                                       \
	} while (0)

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif
