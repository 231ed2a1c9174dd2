/*
 * comm/auth.h: the shared secret of a tensor-parallel group and the HMAC
 * (HMAC-SHA-256, RFC 2104 / FIPS 180-4) that authenticates every connection
 * between its ranks.
 *
 * Why: a rank 0 waiting for workers listens on a TCP port; without a secret
 * anyone who can reach that port and has the public checkpoint can join the
 * group, read every step plan (prompt and output token ids) and change the
 * outputs through its all-reduce contributions. With it, every hello carries
 * HMAC(secret, label | fresh challenge of the listener | the hello's fields),
 * so a stranger, a worker with another secret and a replayed hello (the
 * challenge is new on every connection) are all refused; the answer is MACed
 * over the connector's own challenge, so a worker also knows its master is
 * genuine. The links are authenticated, not encrypted: docs/two-gb10.md says
 * they must be private.
 *
 * The secret is a file (`--tp-secret-file`): its bytes, trailing whitespace
 * removed, at least COMM_SECRET_MIN_BYTES. comm_secret_create_file() makes
 * one (32 random bytes as hex, mode 0600) for the user to copy to the workers.
 */
#ifndef DSV4_COMM_AUTH_H
#define DSV4_COMM_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define COMM_MAC_BYTES 32
#define COMM_CHALLENGE_BYTES 32
/* 16 bytes = 128 bits: the least a guessing attacker may face. */
#define COMM_SECRET_MIN_BYTES 16
#define COMM_SECRET_MAX_BYTES 1024

struct comm_secret {
	size_t n_bytes; /* 0 = no secret: MACs keyed with the empty key (tests only) */
	uint8_t bytes[COMM_SECRET_MAX_BYTES];
};

/* Reads path into s. ST_IO (cannot read), ST_INVALID (shorter than
 * COMM_SECRET_MIN_BYTES or longer than COMM_SECRET_MAX_BYTES). A file other
 * users can read is accepted with a warning. */
DSV4_WUR enum status comm_secret_load(struct comm_secret *s, const char *path, struct err *e);
/* Creates path (must not exist) with a fresh random secret, mode 0600. */
DSV4_WUR enum status comm_secret_create_file(const char *path, struct err *e);
/* Sets s from n bytes (tests, callers with the secret in memory). */
DSV4_WUR enum status comm_secret_set(struct comm_secret *s, const void *bytes, size_t n, struct err *e);

/* Cryptographically random bytes (getrandom). */
DSV4_WUR enum status comm_random_bytes(void *buf, size_t n, struct err *e);

/* SHA-256 and HMAC-SHA-256 over one buffer. */
void comm_sha256(const void *msg, size_t n, uint8_t out[32]);
void comm_hmac_sha256(const void *key, size_t n_key, const void *msg, size_t n, uint8_t out[COMM_MAC_BYTES]);

/* The MAC of one protocol message: HMAC(secret, label NUL a b). secret may
 * be NULL (the empty key). */
void comm_auth_mac(const struct comm_secret *s, const char *label, const void *a, size_t na, const void *b, size_t nb,
		   uint8_t out[COMM_MAC_BYTES]);
/* Constant-time comparison of two MACs. */
bool comm_mac_equal(const uint8_t a[COMM_MAC_BYTES], const uint8_t b[COMM_MAC_BYTES]);

#endif
