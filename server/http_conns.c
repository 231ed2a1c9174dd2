/*
 * server/http_conns.c: connection admission and deadlines for the HTTP
 * layer (http_internal.h). Every open connection has a struct http_sock
 * (its address, when its current request phase began, how far the peer has
 * acknowledged the answer), so that the accept policy can hold the total
 * and per-address limits by evicting the slowest sender (slowloris), and
 * the housekeeper can shut connections whose request is late or whose
 * client stopped reading (issue 17).
 */
#include "http_internal.h"

#include <linux/sockios.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include "common/log.h"
#include "common/timeutil.h"

struct http_sock {
	struct http_sock *next, *prev;
	struct MHD_Connection *c;
	double t0;             /* start of the current request phase */
	bool receiving;        /* headers / body still arriving */
	bool cut;              /* shut down by the housekeeper */
	uint64_t acked;        /* bytes the peer acknowledged at the last progress */
	double progress_t;     /* when the answer last made progress */
	double opened_t;       /* when the connection was accepted */
	struct sockaddr_storage addr; /* the client's (family AF_UNSPEC: unknown) */
};

/* The request phase of c is over (true) or begins again (false). */
void http__sock_phase(struct http_server *s, struct MHD_Connection *c, bool receiving)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	if (!ci || !ci->socket_context)
		return;
	struct http_sock *k = ci->socket_context;
	pthread_mutex_lock(&s->ip_mu);
	k->receiving = receiving;
	k->t0 = k->progress_t = time_mono_s();
	pthread_mutex_unlock(&s->ip_mu);
}

/* While answering: whether the peer took anything since the last look
 * (bytes acknowledged), or nothing waits in the socket at all. */
static bool sock_writing_progressed(struct http_sock *k, int fd)
{
	int unsent = 0;
	if (ioctl(fd, SIOCOUTQ, &unsent) || unsent <= 0)
		return true; /* nothing waits for the peer (or not TCP) */
	struct tcp_info ti;
	socklen_t len = sizeof ti;
	memset(&ti, 0, sizeof ti);
	if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) ||
	    len < offsetof(struct tcp_info, tcpi_bytes_acked) + sizeof ti.tcpi_bytes_acked)
		return true;
	if (ti.tcpi_bytes_acked != k->acked) {
		k->acked = ti.tcpi_bytes_acked;
		return true;
	}
	return false;
}

/* Housekeeper: shut the connections whose request is late, or whose client
 * stopped taking the answer (write-progress deadline: a slow SSE reader
 * would otherwise make its request's events pile up for as long as it
 * generates). A shutdown, not a close: libmicrohttpd sees the end on its next
 * read or write and cleans up; a stream learns it as an abort. */
void http__socks_enforce(struct http_server *s)
{
	double now = time_mono_s();
	pthread_mutex_lock(&s->ip_mu);
	for (struct http_sock *k = s->socks; k; k = k->next) {
		if (k->cut)
			continue;
		if (!k->receiving) {
			const union MHD_ConnectionInfo *ci =
				MHD_get_connection_info(k->c, MHD_CONNECTION_INFO_CONNECTION_FD);
			if (!ci || sock_writing_progressed(k, ci->connect_fd)) {
				k->progress_t = now;
			} else if (now - k->progress_t >= s->write_stall_s) {
				(void)shutdown(ci->connect_fd, SHUT_RDWR);
				k->cut = true;
				log_msg(LOG_WARN, "http", "closed a connection whose client took nothing of the answer for "
					"%.0f s (stalled reader; its request is aborted)", s->write_stall_s);
			}
			continue;
		}
		if (now - k->t0 < s->request_deadline_s)
			continue;
		const union MHD_ConnectionInfo *ci = MHD_get_connection_info(k->c, MHD_CONNECTION_INFO_CONNECTION_FD);
		if (ci) {
			(void)shutdown(ci->connect_fd, SHUT_RDWR);
			k->cut = true;
			log_msg(LOG_WARN, "http", "closed a connection whose request took over %.0f s to arrive (slow client)",
				s->request_deadline_s);
		}
	}
	pthread_mutex_unlock(&s->ip_mu);
}

/* ---- helpers for handlers ---- */

/* ---- per-address connection counts ---- */

static bool ip_same(const struct sockaddr *a, const struct sockaddr_storage *b)
{
	if (a->sa_family != b->ss_family)
		return false;
	if (a->sa_family == AF_INET)
		return ((const struct sockaddr_in *)a)->sin_addr.s_addr == ((const struct sockaddr_in *)b)->sin_addr.s_addr;
	if (a->sa_family == AF_INET6)
		return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr,
			       sizeof(struct in6_addr));
	return false;
}

/* The count of addr's connections (NULL: not seen). Under ip_mu. */
static struct http_ip_count *ip_find(struct http_server *s, const struct sockaddr *addr)
{
	for (size_t i = 0; i < s->n_ips; i++)
		if (ip_same(addr, &s->ips[i].a))
			return &s->ips[i];
	return NULL;
}

/* At a connection limit, make room by shutting the oldest connection still
 * sending its request (a slowloris holds its slots that way; a request being
 * answered is never touched), of addr when given, at least
 * HTTP_EVICT_MIN_AGE_S old. False when there is none. Under ip_mu. */
static bool evict_slow(struct http_server *s, const struct sockaddr *addr, double now)
{
	struct http_sock *best = NULL;
	for (struct http_sock *k = s->socks; k; k = k->next) {
		if (!k->receiving || k->cut || now - k->opened_t < HTTP_EVICT_MIN_AGE_S)
			continue;
		if (addr && !ip_same(addr, &k->addr))
			continue;
		if (!best || k->t0 < best->t0)
			best = k;
	}
	if (!best)
		return false;
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(best->c, MHD_CONNECTION_INFO_CONNECTION_FD);
	if (!ci)
		return false;
	(void)shutdown(ci->connect_fd, SHUT_RDWR);
	best->cut = true;
	if (now - s->evict_log_t >= 1.0) {
		s->evict_log_t = now;
		log_msg(LOG_WARN, "http", "at the %s connection limit: closed a connection whose request had not "
			"arrived after %.0f s (slow client) to admit a new one", addr ? "per-address" : "total",
			now - best->t0);
	}
	return true;
}

/* Accept policy: an address that already has its share, or a server at its
 * connection limit, admits the new connection only by evicting a slow one
 * (so /health stays answerable under a slowloris from any address). */
enum MHD_Result http__on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
	(void)addrlen;
	struct http_server *s = cls;
	if (!addr)
		return MHD_YES;
	double now = time_mono_s();
	pthread_mutex_lock(&s->ip_mu);
	bool ok = true;
	if (s->opt.max_connections_per_ip) {
		struct http_ip_count *ic = ip_find(s, addr);
		if (ic && ic->n >= s->opt.max_connections_per_ip)
			ok = evict_slow(s, addr, now);
	}
	if (ok && s->n_socks >= s->max_socks)
		ok = evict_slow(s, NULL, now);
	pthread_mutex_unlock(&s->ip_mu);
	return ok ? MHD_YES : MHD_NO;
}

static void ip_track(struct http_server *s, struct MHD_Connection *c, int delta)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	if (!s->opt.max_connections_per_ip || !ci || !ci->client_addr)
		return;
	const struct sockaddr *addr = ci->client_addr;
	pthread_mutex_lock(&s->ip_mu);
	struct http_ip_count *ic = ip_find(s, addr);
	if (!ic && delta > 0) {
		if (s->n_ips == s->cap_ips) {
			size_t cap = s->cap_ips ? 2 * s->cap_ips : 64;
			struct http_ip_count *p = realloc(s->ips, cap * sizeof *p);
			if (p) {
				s->ips = p;
				s->cap_ips = cap;
			}
		}
		if (s->n_ips < s->cap_ips) {
			ic = &s->ips[s->n_ips++];
			memset(ic, 0, sizeof *ic);
			memcpy(&ic->a, addr, addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
								     : sizeof(struct sockaddr_in));
		}
	}
	if (ic) {
		if (delta > 0)
			ic->n++;
		else if (ic->n > 0 && --ic->n == 0)
			*ic = s->ips[--s->n_ips]; /* drop the entry: the table holds open addresses only */
	}
	pthread_mutex_unlock(&s->ip_mu);
}

/* A new connection gets the short request-phase timeout until its request is in. */
void http__on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
			 enum MHD_ConnectionNotificationCode toe)
{
	struct http_server *s = cls;
	ip_track(s, c, toe == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1);
	if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
		struct http_sock *k = calloc(1, sizeof *k);
		if (k) {
			k->c = c;
			k->t0 = k->opened_t = k->progress_t = time_mono_s();
			k->receiving = true;
			const union MHD_ConnectionInfo *ai = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
			if (ai && ai->client_addr)
				memcpy(&k->addr, ai->client_addr, ai->client_addr->sa_family == AF_INET6
									  ? sizeof(struct sockaddr_in6)
									  : sizeof(struct sockaddr_in));
			pthread_mutex_lock(&s->ip_mu);
			k->next = s->socks;
			if (s->socks)
				s->socks->prev = k;
			s->socks = k;
			s->n_socks++;
			pthread_mutex_unlock(&s->ip_mu);
		}
		*socket_context = k;
	} else if (*socket_context) {
		struct http_sock *k = *socket_context;
		pthread_mutex_lock(&s->ip_mu);
		if (k->prev)
			k->prev->next = k->next;
		else
			s->socks = k->next;
		if (k->next)
			k->next->prev = k->prev;
		s->n_socks--;
		pthread_mutex_unlock(&s->ip_mu);
		free(k);
		*socket_context = NULL;
	}
	if (toe == MHD_CONNECTION_NOTIFY_STARTED && s->request_timeout_s != s->opt.connection_timeout_s)
		MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, s->request_timeout_s);
}
