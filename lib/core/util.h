/* Small helpers shared by every module: time, backoff, strings. */
#ifndef SPOT_UTIL_H
#define SPOT_UTIL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* An intended fall-through between switch labels (gcc and clang). */
#define SPOT_FALLTHROUGH __attribute__((fallthrough))
#define SPOT_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define spot_container_of(ptr, type, member)                                   \
  ((type *)(void *)((char *)(ptr)-offsetof(type, member)))

/* The six-character suffix mkstemp(3) and mkdtemp(3) replace. */
#define SPOT_MKTEMP_SUFFIX "XXXXXX"

/* Monotonic milliseconds (CLOCK_MONOTONIC) and wall-clock milliseconds
 * since the epoch. Deadlines are always kept on the monotonic clock. */
uint64_t spot_now_mono_ms(void);
int64_t spot_now_wall_ms(void);

/* Copies at most size-1 bytes and terminates. Returns strlen(src), so a
 * result >= size means truncation. */
size_t spot_strlcpy(char *dst, const char *src, size_t size);
/* path made absolute against the current directory (not resolved: no
 * symlink is followed). 0, or -ENAMETOOLONG / negative errno. */
int spot_abs_path(const char *path, char *out, size_t size);

/* spot_strlcpy that cuts only between whole UTF-8 characters, so a valid
 * src gives a valid dst. Returns strlen(src). */
size_t spot_strlcpy_utf8(char *dst, const char *src, size_t size);
/* Whether the NUL-terminated s is valid UTF-8 (no overlong forms, no
 * surrogates, nothing above U+10FFFF): what JSON strings may hold. */
bool spot_utf8_valid(const char *s);

/* Strict integer parsing: the whole string, base 10, within [min, max].
 * Returns 0 or -EINVAL / -ERANGE; *out only set on success. */
int spot_parse_int64(const char *s, int64_t min, int64_t max, int64_t *out);
/* Sizes with an optional K/M/G suffix (powers of 1024), e.g. "8M". */
int spot_parse_size(const char *s, uint64_t *out);

/* RFC 3339 ("2026-12-02T10:13:50Z", fractions and +hh:mm offsets
 * accepted) to milliseconds since the epoch. */
int spot_rfc3339_parse(const char *s, int64_t *out_ms);
/* Formats as "YYYY-MM-DDTHH:MM:SSZ" (UTC). buf needs 21 bytes. */
int spot_rfc3339_format(int64_t ms, char *buf, size_t size);

/* Exponential backoff with full jitter: a delay in [base/2, min(cap,
 * base * 2^attempt)] milliseconds. rnd is a uniform 32-bit random value
 * (pass spot_random_u32() in production, a fixed value in tests). */
uint64_t spot_backoff_ms(unsigned attempt, uint64_t base_ms, uint64_t cap_ms,
                         uint32_t rnd);
uint32_t spot_random_u32(void);

/* Removes a folder and everything below it, without following links
 * (best effort: what cannot be removed stays). */
void spot_rm_tree(const char *path);
/* The disk space a tree takes (st_blocks of everything below path on
 * its own file system, links not followed; a hard-linked file counts
 * once per name) and the file system it is on.
 * 0, or negative errno when path cannot be read. */
int spot_tree_usage(const char *path, uint64_t *bytes, uint64_t *dev);
/* The bytes an unprivileged writer may still use on the file system of
 * path (statvfs f_bavail x f_frsize) and its block size. 0 or negative
 * errno; a file system that reports no block count (some FUSE ones)
 * gives -ENOTSUP: its free space is unknown. */
int spot_fs_avail(const char *path, uint64_t *avail, uint64_t *block);

/* A string that came from the network or the store, made safe to print:
 * copies src into dst (size bytes, always terminated; cut only between
 * whole characters) with every C0 control and DEL as \n, \r, \t or \xNN,
 * invalid UTF-8 bytes as \xNN, and C1 controls (U+0080..U+009F), line and
 * paragraph separators and bidi overrides as \uNNNN. Printable ASCII and
 * other valid UTF-8 pass unchanged; a backslash is not escaped, so
 * escaping twice changes nothing. Returns dst ("" for a NULL src).
 * SPOT_ESCAPE_SIZE(n) fits the escape of n bytes. */
#define SPOT_ESCAPE_SIZE(n) (4 * (n) + 1)
const char *spot_escape(const char *src, char *dst, size_t size);
/* A fault point for tests: when the build has fault points (the tests
 * are built: SPOT_FAULT_POINTS) and $SPOTD_FAULT names this point, logs
 * one line and kills this process with SIGKILL, exactly there ("NAME:stop":
 * stops it with SIGSTOP instead, until a SIGCONT). Points:
 * "before-commit" (a push about to check its lease and write its
 * manifest), "after-manifest" (a commit's manifest written, LATEST not yet
 * moved), "restore-space-checked" (a restore found room for the
 * checkpoint and writes nothing yet).
 * Also $SPOTD_FAULT_CLOCK_MS: spot_now_wall_ms() runs that many ms ahead
 * (negative: behind), a node whose clock is off; and
 * $SPOTD_FAULT_CLOCK_STEP_MS=STEP@AFTER: it steps by STEP ms once AFTER ms
 * have passed since the start (a clock stepped while spotd runs).
 * Without fault points it does nothing and reads no environment. */
void spot_fault_point(const char *name);
/* Writes fmt into err (when err is not NULL and errlen > 0): the one
 * helper behind every "(char *err, size_t errlen)" out-parameter. */
void spot_set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void spot_vset_err(char *err, size_t errlen, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

/* $ENV/LEAF (the first folder of a colon-separated systemd list such as
 * RUNTIME_DIRECTORY), else fallback; malloc'd into *out. */
int spot_default_path(const char *env, const char *leaf, const char *fallback,
                      char **out);
/* The control socket's default, the same for spotd and spotctl:
 * $RUNTIME_DIRECTORY/spotd.sock, else ./spotd.sock. */
#define SPOT_SOCKET_ENV "RUNTIME_DIRECTORY"
#define SPOT_SOCKET_LEAF "spotd.sock"
#define SPOT_SOCKET_FALLBACK "./spotd.sock"
int spot_default_socket(char **out);

/* Human-readable byte counts ("1.5 GiB") into buf. */
const char *spot_fmt_bytes(uint64_t n, char *buf, size_t size);

/* n bytes (zeroed) for a big data buffer (a part, a frame), in a mapping
 * of its own aligned to 2 MiB, whose first `huge` bytes (rounded down to
 * 2 MiB) are marked for transparent huge pages (MADV_HUGEPAGE; the
 * system's default is often "madvise"): they fault in as a few huge pages
 * instead of thousands of 4 KiB ones, and the codec's passes over them
 * miss the TLB less (a push of 1 GiB with 8 MiB parts: 11-20 % less CPU,
 * bench/store_bench.sh's discard sink). A huge page counts whole in the
 * RSS once touched: advise only what is always used. NULL on failure.
 * Free with spot_big_free(p, n). */
void *spot_big_alloc(size_t n, size_t huge);
void spot_big_free(void *p, size_t n);

#endif
