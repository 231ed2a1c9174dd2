/*
 * comm/auth.c: SHA-256, HMAC-SHA-256 and the group secret (comm/auth.h).
 *
 * Written from FIPS 180-4 and RFC 2104; checked against their published test
 * vectors in tests/comm/test_auth.c. Small and dependency-free on purpose:
 * the only use is a few MACs per connection set-up.
 */
#include "comm/auth.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"

struct sha256 {
	uint32_t h[8];
	uint64_t n_bytes;
	uint8_t buf[64];
	size_t n_buf;
};

static const uint32_t sha__k[64] = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
	0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
	0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
	0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
	0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t ror(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void sha__block(struct sha256 *s, const uint8_t *p)
{
	uint32_t w[64];
	for (int i = 0; i < 16; i++)
		w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
	for (int i = 16; i < 64; i++) {
		uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
		uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
		w[i] = w[i - 16] + s0 + w[i - 7] + s1;
	}
	uint32_t a = s->h[0], b = s->h[1], c = s->h[2], d = s->h[3], e = s->h[4], f = s->h[5], g = s->h[6],
		 h = s->h[7];
	for (int i = 0; i < 64; i++) {
		uint32_t t1 = h + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) + sha__k[i] + w[i];
		uint32_t t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
		h = g;
		g = f;
		f = e;
		e = d + t1;
		d = c;
		c = b;
		b = a;
		a = t1 + t2;
	}
	s->h[0] += a; s->h[1] += b; s->h[2] += c; s->h[3] += d;
	s->h[4] += e; s->h[5] += f; s->h[6] += g; s->h[7] += h;
}

static void sha__init(struct sha256 *s)
{
	static const uint32_t h0[8] = { 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
					0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19 };
	memcpy(s->h, h0, sizeof h0);
	s->n_bytes = 0;
	s->n_buf = 0;
}

static void sha__update(struct sha256 *s, const void *msg, size_t n)
{
	const uint8_t *p = msg;
	s->n_bytes += n;
	while (n > 0) {
		size_t take = 64 - s->n_buf < n ? 64 - s->n_buf : n;
		memcpy(s->buf + s->n_buf, p, take);
		s->n_buf += take;
		p += take;
		n -= take;
		if (s->n_buf == 64) {
			sha__block(s, s->buf);
			s->n_buf = 0;
		}
	}
}

static void sha__final(struct sha256 *s, uint8_t out[32])
{
	uint64_t bits = s->n_bytes * 8;
	uint8_t pad = 0x80;
	sha__update(s, &pad, 1);
	uint8_t zero = 0;
	while (s->n_buf != 56)
		sha__update(s, &zero, 1);
	uint8_t len[8];
	for (int i = 0; i < 8; i++)
		len[i] = (uint8_t)(bits >> (56 - 8 * i));
	sha__update(s, len, 8);
	for (int i = 0; i < 8; i++) {
		out[4 * i] = (uint8_t)(s->h[i] >> 24);
		out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
		out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
		out[4 * i + 3] = (uint8_t)s->h[i];
	}
}

void comm_sha256(const void *msg, size_t n, uint8_t out[32])
{
	struct sha256 s;
	sha__init(&s);
	sha__update(&s, msg, n);
	sha__final(&s, out);
}

/* HMAC with up to three message parts. */
static void hmac__parts(const void *key, size_t n_key, const void *const *parts, const size_t *n_parts, int n,
			uint8_t out[32])
{
	uint8_t k[64] = { 0 };
	if (n_key > 64)
		comm_sha256(key, n_key, k);
	else if (n_key)
		memcpy(k, key, n_key);
	uint8_t pad[64];
	struct sha256 s;
	for (int i = 0; i < 64; i++)
		pad[i] = k[i] ^ 0x36;
	sha__init(&s);
	sha__update(&s, pad, 64);
	for (int i = 0; i < n; i++)
		sha__update(&s, parts[i], n_parts[i]);
	uint8_t inner[32];
	sha__final(&s, inner);
	for (int i = 0; i < 64; i++)
		pad[i] = k[i] ^ 0x5c;
	sha__init(&s);
	sha__update(&s, pad, 64);
	sha__update(&s, inner, 32);
	sha__final(&s, out);
}

void comm_hmac_sha256(const void *key, size_t n_key, const void *msg, size_t n, uint8_t out[COMM_MAC_BYTES])
{
	const void *parts[1] = { msg };
	size_t ns[1] = { n };
	hmac__parts(key, n_key, parts, ns, 1, out);
}

void comm_auth_mac(const struct comm_secret *s, const char *label, const void *a, size_t na, const void *b, size_t nb,
		   uint8_t out[COMM_MAC_BYTES])
{
	const void *parts[3] = { label, a ? a : "", b ? b : "" };
	size_t ns[3] = { strlen(label) + 1, a ? na : 0, b ? nb : 0 };
	hmac__parts(s ? s->bytes : NULL, s ? s->n_bytes : 0, parts, ns, 3, out);
}

bool comm_mac_equal(const uint8_t a[COMM_MAC_BYTES], const uint8_t b[COMM_MAC_BYTES])
{
	volatile uint8_t d = 0;
	for (int i = 0; i < COMM_MAC_BYTES; i++)
		d |= a[i] ^ b[i];
	return d == 0;
}

enum status comm_random_bytes(void *buf, size_t n, struct err *e)
{
	uint8_t *p = buf;
	while (n > 0) {
		ssize_t r = getrandom(p, n, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return err_set(e, ST_IO, "comm: getrandom: %s", strerror(errno));
		p += r;
		n -= (size_t)r;
	}
	return ST_OK;
}

enum status comm_secret_set(struct comm_secret *s, const void *bytes, size_t n, struct err *e)
{
	if (n < COMM_SECRET_MIN_BYTES || n > COMM_SECRET_MAX_BYTES)
		return err_set(e, ST_INVALID, "tp secret of %zu bytes: must be %d..%d bytes", n, COMM_SECRET_MIN_BYTES,
			       COMM_SECRET_MAX_BYTES);
	memset(s, 0, sizeof *s);
	memcpy(s->bytes, bytes, n);
	s->n_bytes = n;
	return ST_OK;
}

enum status comm_secret_load(struct comm_secret *s, const char *path, struct err *e)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return err_set(e, ST_IO, "tp secret file %s: %s", path, strerror(errno));
	struct stat sb;
	if (fstat(fd, &sb) == 0 && (sb.st_mode & (S_IRWXG | S_IRWXO)))
		log_msg(LOG_WARN, "comm", "tp secret file %s is readable by other users (mode %03o): chmod 600 it", path,
			(unsigned)(sb.st_mode & 0777));
	uint8_t buf[COMM_SECRET_MAX_BYTES + 1];
	size_t n = 0;
	for (;;) {
		ssize_t r = read(fd, buf + n, sizeof buf - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			int en = errno;
			close(fd);
			return err_set(e, ST_IO, "tp secret file %s: read: %s", path, strerror(en));
		}
		if (r == 0 || (n += (size_t)r) == sizeof buf)
			break;
	}
	close(fd);
	if (n > COMM_SECRET_MAX_BYTES)
		return err_set(e, ST_INVALID, "tp secret file %s: longer than %d bytes", path, COMM_SECRET_MAX_BYTES);
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
		n--;
	enum status st = comm_secret_set(s, buf, n, e);
	memset(buf, 0, sizeof buf);
	if (st)
		return err_prefix(e, "file %s", path);
	return ST_OK;
}

enum status comm_secret_create_file(const char *path, struct err *e)
{
	uint8_t raw[32];
	enum status st = comm_random_bytes(raw, sizeof raw, e);
	if (st)
		return st;
	char hex[2 * sizeof raw + 2];
	for (size_t i = 0; i < sizeof raw; i++)
		snprintf(hex + 2 * i, 3, "%02x", raw[i]);
	hex[2 * sizeof raw] = '\n';
	hex[2 * sizeof raw + 1] = '\0';
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		return err_set(e, ST_IO, "tp secret file %s: cannot create: %s", path, strerror(errno));
	size_t n = strlen(hex);
	ssize_t w = write(fd, hex, n);
	int en = errno;
	if (close(fd) != 0 || w != (ssize_t)n) {
		unlink(path);
		return err_set(e, ST_IO, "tp secret file %s: write: %s", path, strerror(en));
	}
	return ST_OK;
}
