/*
 * comm/limits.h: the named limits of the communicator and the bootstrap, with
 * units and the reason for each value (style.md rule 18).
 */
#ifndef DSV4_COMM_LIMITS_H
#define DSV4_COMM_LIMITS_H

/* Default bound on every collective wait. Generous because NCCL connects
 * lazily on the first collective (seconds across two nodes) and a prefill
 * step of a long prompt may keep one rank busy before it joins. */
#define COMM_DEFAULT_TIMEOUT_MS 120000

/* Device staging buffer of the NCCL backend for host-memory collectives;
 * larger transfers are chunked. Host calls are for step plans and small
 * control data, so 4 MiB is plenty and cheap. */
#define COMM_NCCL_STAGING_BYTES (4u << 20)

/* Ranks in one group: TP sizes are small powers of two. */
#define COMM_MAX_RANKS 64

/* Bootstrap: how long a worker keeps retrying to connect, and a master keeps
 * accepting, when the caller passes 0. Two nodes started by hand a minute
 * apart must still meet. */
#define COMM_BOOT_DEFAULT_TIMEOUT_MS 120000
/* Pause between connect attempts of a worker whose master is not up yet. */
#define COMM_BOOT_CONNECT_RETRY_MS 200
/* A connection to the master must say hello within this time, or it is
 * dropped (a port probe) and the master keeps waiting for real workers. */
#define COMM_BOOT_HELLO_TIMEOUT_MS 5000
/* Largest bootstrap message payload; the hello is < 200 bytes, so anything
 * bigger is garbage and is refused before allocating. */
#define COMM_BOOT_MAX_PAYLOAD_BYTES 4096
/* Longest dsv4 version string carried in the hello. */
#define COMM_BOOT_MAX_VERSION_BYTES 64
/* Longest rejection reason carried back to a worker. */
#define COMM_BOOT_MAX_REASON_BYTES 400
/* TCP keepalive on the liveness connections, so that a peer whose machine
 * vanished (power, cable) is noticed in about idle + intvl * cnt = 11 s
 * rather than the kernel's default two hours. */
#define COMM_BOOT_KEEPIDLE_S 5
#define COMM_BOOT_KEEPINTVL_S 2
#define COMM_BOOT_KEEPCNT 3

#endif
