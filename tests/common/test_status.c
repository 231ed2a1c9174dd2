/*
 * tests/common/test_status.c: status names and the error buffer.
 */
#include "common/status.h"
#include "tests/test.h"

int main(void)
{
	struct err e;
	err_clear(&e);
	T_CHECK(e.st == ST_OK && e.msg[0] == '\0');
	T_CHECK(err_set(&e, ST_INVALID, "field %s: bad", "hidden_size") == ST_INVALID);
	T_CHECK(!strcmp(e.msg, "field hidden_size: bad"));
	T_CHECK(err_prefix(&e, "%s", "config.json") == ST_INVALID);
	T_CHECK(!strcmp(e.msg, "config.json: field hidden_size: bad"));
	T_CHECK(err_set(NULL, ST_IO, "x") == ST_IO);
	T_CHECK(!strcmp(status_str(ST_NOMEM), "out of memory"));
	T_CHECK(!strcmp(status_str((enum status)-100), "unknown status"));
	/* A long message is truncated, never overflows. */
	char big[2000];
	memset(big, 'a', sizeof big - 1);
	big[sizeof big - 1] = '\0';
	err_set(&e, ST_INVALID, "%s", big);
	T_CHECK(strlen(e.msg) == ERR_MSG_BYTES - 1);
	err_prefix(&e, "p");
	T_CHECK(strlen(e.msg) == ERR_MSG_BYTES - 1 && e.msg[0] == 'p');
	return test_exit();
}
