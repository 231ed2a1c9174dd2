/*
 * common/log.c: timestamped leveled lines on stderr, one write(2) each so that
 * lines from several threads never interleave.
 */
#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static atomic_int g_level = -1;

static enum log_level level_from_env(void)
{
	const char *s = getenv("DSV4_LOG_LEVEL");
	if (!s)
		return LOG_INFO;
	if (!strcasecmp(s, "debug"))
		return LOG_DEBUG;
	if (!strcasecmp(s, "warn"))
		return LOG_WARN;
	if (!strcasecmp(s, "error"))
		return LOG_ERROR;
	return LOG_INFO;
}

void log_set_level(enum log_level lvl) { atomic_store(&g_level, (int)lvl); }

enum log_level log_get_level(void)
{
	int l = atomic_load(&g_level);
	if (l < 0) {
		l = (int)level_from_env();
		atomic_store(&g_level, l);
	}
	return (enum log_level)l;
}

void log_msg(enum log_level lvl, const char *module, const char *fmt, ...)
{
	if (lvl < log_get_level())
		return;
	static const char *names[] = {"DEBUG", "INFO ", "WARN ", "ERROR"};
	char line[2048];
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	struct tm tm;
	gmtime_r(&ts.tv_sec, &tm);
	int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s: ",
			 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
			 tm.tm_sec, ts.tv_nsec / 1000000, names[lvl], module);
	va_list ap;
	va_start(ap, fmt);
	if (n > 0 && (size_t)n < sizeof line)
		n += vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n >= sizeof line - 1)
		n = (int)sizeof line - 2;
	line[n++] = '\n';
	ssize_t w = write(STDERR_FILENO, line, (size_t)n);
	(void)w;
}
