/*
 * common/log.h: one leveled logging call for the whole program.
 *
 * One line per event on stderr: "2026-12-02T15:20:01.123Z INFO  model: message".
 * Thread-safe (one write(2) per line). Kernels and per-token paths do not log.
 */
#ifndef DSV4_COMMON_LOG_H
#define DSV4_COMMON_LOG_H

#include "status.h"

enum log_level { LOG_DEBUG = 0, LOG_INFO = 1, LOG_WARN = 2, LOG_ERROR = 3 };

/* Lines below this level are dropped. Default LOG_INFO, or $DSV4_LOG_LEVEL
 * (debug|info|warn|error) read on first use. */
void log_set_level(enum log_level lvl);
enum log_level log_get_level(void);

/* module: short subsystem name ("model", "sched", "server"). */
void log_msg(enum log_level lvl, const char *module, const char *fmt, ...) DSV4_PRINTF(3, 4);

#endif
