/* reqfile.h: the layout of the checkpoint request file, the one place it
 * is written down. spotd (daemon/request.c) and the Python helper
 * (python/spotd/__init__.py, whose constants a test compares with these)
 * share it; a trainer that reads the file itself follows it too.
 *
 * SOCKET.req, SPOT_REQ_FILE_SIZE bytes, little-endian, naturally aligned,
 * mode SPOT_REQ_FILE_MODE (the trainer runs as spotd's user; the counters
 * are nobody else's to read). Slots (u64 unless said):
 *
 *   MAGIC     "SPOTDREQ" (8 bytes)
 *   VERSION   u32; a reader refuses another version (and takes the signal)
 *   SEQ       spotd: the id of the newest request (0 = none yet). A
 *             reader takes a request when SEQ > SERVED and SEQ is not the
 *             one it took last: spotd rewrites SEQ and SERVED at every
 *             request (SEQ is not trusted to only grow: anything may have
 *             been written into the file), so a garbage value is taken at
 *             most once and never hides a later request.
 *   SERVED    spotd: = SEQ once that checkpoint is complete or dropped
 *   POLLS     the helper: nonzero once a process polled since spotd
 *             started the trainer (spotd zeroes it then; tests it only
 *             for zero)
 *   ATTACHED  the helper: one more per import
 *   DEADLINE  spotd, written with every request (and when a drain
 *             starts while one is pending): 0 = no deadline known, else
 *             the wall-clock time in unix ms (i64) by which the
 *             checkpoint must be complete (its SPOTD_COMPLETE marker
 *             written) for spotd to commit it in time: the notice's
 *             termination time (or SIGTERM + SPOTD_TERMINATION_GRACE)
 *             less the margin spotd keeps to stop the trainer and less
 *             the upload time it estimates (its last upload's bytes at
 *             its measured rate; none when nothing was uploaded yet).
 *             May lie in the past: time is up.
 *
 * DEADLINE was added within version 2: a version-2 reader that predates
 * it never reads past ATTACHED, and a file written by a spotd that
 * predates it holds 0 there (the file is created zero-filled), which
 * reads as "no deadline known". No reader is misled either way, so the
 * version stays 2.
 *
 * Both sides read and write with pread()/pwrite(), never through a
 * mapping: a file truncated under a mapping kills the process that
 * touches it (SIGBUS). The helper still maps it (PROT_READ, never read):
 * spotd recognises a process the helper serves by the file's device and
 * inode in /proc/PID/maps, so a file renamed over the path is never
 * mistaken for it. SPOT_REQ_ENV_ID ("DEV:INO" of fstat(), decimal) tells
 * the helper which file is spotd's: another at the path is refused. */
#ifndef SPOT_REQFILE_H
#define SPOT_REQFILE_H

#define SPOT_REQ_FILE_SIZE 4096
#define SPOT_REQ_FILE_MODE 0600
#define SPOT_REQ_MAGIC "SPOTDREQ"
#define SPOT_REQ_VERSION 2
#define SPOT_REQ_ENV_ID "SPOTD_REQUEST_ID"

/* byte offsets */
#define SPOT_REQ_OFF_MAGIC 0
#define SPOT_REQ_OFF_VERSION 8
#define SPOT_REQ_OFF_SEQ 16
#define SPOT_REQ_OFF_SERVED 24
#define SPOT_REQ_OFF_POLLS 32
#define SPOT_REQ_OFF_ATTACHED 40
#define SPOT_REQ_OFF_DEADLINE 48

#endif
