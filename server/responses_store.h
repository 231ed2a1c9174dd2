/*
 * server/responses_store.h: the bounded in-memory store of /v1/responses
 * answers (GET / DELETE /v1/responses/{id}, previous_response_id).
 *
 * Each entry is a response id with two JSON texts: the response object (what
 * GET returns) and the conversation it ends (an OpenAI chat messages array:
 * the earlier history, this request's input and the answer; what a follow-up
 * with previous_response_id continues). The store holds at most max_bytes of
 * ids and texts; putting a new entry evicts the oldest ones until it fits
 * (an entry larger than the whole store is not kept). Nothing survives a
 * restart. Thread-safe (one mutex).
 */
#ifndef DSV4_SERVER_RESPONSES_STORE_H
#define DSV4_SERVER_RESPONSES_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

struct resp_store;

enum status resp_store_create(struct resp_store **out, size_t max_bytes, struct err *e) DSV4_WUR;
/* NULL is a no-op. */
void resp_store_destroy(struct resp_store *s);

/* Keep copies of the texts under id (an existing id is replaced). Returns
 * ST_OK, ST_INVALID when the entry alone exceeds max_bytes (nothing kept),
 * or ST_NOMEM. */
enum status resp_store_put(struct resp_store *s, const char *id, const char *response_json, size_t response_len,
			   const char *history_json, size_t history_len) DSV4_WUR;

/* malloc'd copies (NUL-terminated) of what id holds; either out pointer may
 * be NULL. ST_NOTFOUND when id is unknown or evicted, ST_NOMEM. */
enum status resp_store_get(struct resp_store *s, const char *id, char **response_json, size_t *response_len,
			   char **history_json, size_t *history_len) DSV4_WUR;

/* Forget id; false when it was not there. */
bool resp_store_delete(struct resp_store *s, const char *id);

/* Bytes held (ids + texts) and entries. */
size_t resp_store_bytes(struct resp_store *s);
uint32_t resp_store_count(struct resp_store *s);

#endif
