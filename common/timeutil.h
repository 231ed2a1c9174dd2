/*
 * common/timeutil.h: monotonic and wall clocks in the units the metrics use.
 */
#ifndef DSV4_COMMON_TIMEUTIL_H
#define DSV4_COMMON_TIMEUTIL_H

#include <stdint.h>
#include <time.h>

static inline double time_mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline double time_wall_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
