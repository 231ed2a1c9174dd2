/*
 * tests/comm/test_auth.c: SHA-256 and HMAC-SHA-256 against the FIPS 180-4 and
 * RFC 4231 vectors, the multi-part MAC against the one-buffer HMAC on random
 * inputs (every block boundary), and the secret file: created 0600, loaded
 * back, too short refused, trailing newline ignored.
 */
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "comm/auth.h"
#include "tests/test.h"

static void hex(const uint8_t *p, size_t n, char *out)
{
	for (size_t i = 0; i < n; i++)
		snprintf(out + 2 * i, 3, "%02x", p[i]);
}

static void check_sha(const char *msg, size_t n, const char *want)
{
	uint8_t d[32];
	char h[65];
	comm_sha256(msg, n, d);
	hex(d, 32, h);
	T_CHECKF(!strcmp(h, want), "sha256 of %zu bytes: %s, want %s", n, h, want);
}

static void check_hmac(const void *key, size_t nk, const char *msg, const char *want)
{
	uint8_t d[32];
	char h[65];
	comm_hmac_sha256(key, nk, msg, strlen(msg), d);
	hex(d, 32, h);
	T_CHECKF(!strcmp(h, want), "hmac key %zu bytes: %s, want %s", nk, h, want);
}

static void test_vectors(void)
{
	check_sha("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
	check_sha("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
	const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
	check_sha(m, strlen(m), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
	char *mil = malloc(1000000);
	memset(mil, 'a', 1000000);
	check_sha(mil, 1000000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
	free(mil);
	uint8_t k1[20];
	memset(k1, 0x0b, sizeof k1);
	check_hmac(k1, sizeof k1, "Hi There", "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
	check_hmac("Jefe", 4, "what do ya want for nothing?",
		   "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
	uint8_t k6[131];
	memset(k6, 0xaa, sizeof k6);
	check_hmac(k6, sizeof k6, "Test Using Larger Than Block-Size Key - Hash Key First",
		   "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

/* comm_auth_mac(label, a, b) == HMAC(label NUL a b), for random sizes across
 * the 64-byte block boundaries; one flipped bit changes it. */
static void test_parts(void)
{
	unsigned seed = (unsigned)time(NULL);
	srand(seed);
	struct comm_secret s;
	uint8_t key[40];
	for (size_t i = 0; i < sizeof key; i++)
		key[i] = (uint8_t)rand();
	struct err e;
	T_CHECK(comm_secret_set(&s, key, sizeof key, &e) == ST_OK);
	uint8_t a[200], b[200], cat[420];
	for (int it = 0; it < 200; it++) {
		size_t na = (size_t)rand() % 200, nb = (size_t)rand() % 200;
		for (size_t i = 0; i < na; i++)
			a[i] = (uint8_t)rand();
		for (size_t i = 0; i < nb; i++)
			b[i] = (uint8_t)rand();
		memcpy(cat, "lbl", 4);
		memcpy(cat + 4, a, na);
		memcpy(cat + 4 + na, b, nb);
		uint8_t m1[32], m2[32];
		comm_auth_mac(&s, "lbl", a, na, b, nb, m1);
		comm_hmac_sha256(key, sizeof key, cat, 4 + na + nb, m2);
		T_CHECKF(comm_mac_equal(m1, m2), "seed %u it %d", seed, it);
		if (na) {
			a[rand() % na] ^= (uint8_t)(1u << (rand() % 8));
			comm_auth_mac(&s, "lbl", a, na, b, nb, m2);
			T_CHECKF(!comm_mac_equal(m1, m2), "seed %u it %d: bit flip", seed, it);
		}
	}
	uint8_t r1[32], r2[32];
	T_CHECK(comm_random_bytes(r1, 32, &e) == ST_OK && comm_random_bytes(r2, 32, &e) == ST_OK);
	T_CHECK(memcmp(r1, r2, 32) != 0);
}

static void test_file(void)
{
	char dir[] = "/tmp/dsv4_auth_XXXXXX";
	T_CHECK(mkdtemp(dir) != NULL);
	char path[128];
	snprintf(path, sizeof path, "%s/secret", dir);
	struct err e;
	T_CHECKF(comm_secret_create_file(path, &e) == ST_OK, "%s", e.msg);
	struct stat sb;
	T_CHECK(stat(path, &sb) == 0 && (sb.st_mode & 0777) == 0600);
	T_CHECK(comm_secret_create_file(path, &e) == ST_IO); /* never overwrites */
	struct comm_secret s;
	T_CHECKF(comm_secret_load(&s, path, &e) == ST_OK, "%s", e.msg);
	T_CHECK(s.n_bytes == 64); /* hex, newline stripped */
	unlink(path);
	FILE *f = fopen(path, "w");
	fputs("short\n", f);
	fclose(f);
	T_CHECK(comm_secret_load(&s, path, &e) == ST_INVALID);
	T_STR_CONTAINS(e.msg, "must be");
	unlink(path);
	T_CHECK(comm_secret_load(&s, path, &e) == ST_IO);
	rmdir(dir);
}

int main(void)
{
	test_vectors();
	test_parts();
	test_file();
	return test_exit();
}
