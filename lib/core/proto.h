/* The control protocol between spotd and spotctl: every message, in one
 * versioned header (the model is tmux's tmux-protocol.h). Sans-I/O: bytes
 * in, decoded messages out; encoders append lines to a spot_buf.
 *
 * Framing: JSON lines over the control socket (a Unix stream socket). One
 * JSON object per line, '\n'-terminated, at most SPOT_PROTO_MAX_LINE bytes
 * before the newline. A trailing '\r' is ignored, and so are empty lines.
 * Anything else that is not a valid message (oversized line, invalid JSON,
 * not an object, wrong field types, unknown version) is a protocol error:
 * the reader stops and the peer drops the connection. Never fatal to the
 * daemon.
 *
 * Request  (spotctl -> spotd):
 *   {"v":1,"id":N,"cmd":"NAME","args":{...}}
 * Response (spotd -> spotctl), exactly one per request, same id:
 *   {"v":1,"id":N,"ok":true,"result":{...}}
 *   {"v":1,"id":N,"ok":false,"error":"one human line"}
 * v is SPOT_PROTO_VERSION; id an integer in [0, 2^53) chosen by the client;
 * "args" and "result" may be omitted when empty. Unknown top-level fields
 * are ignored (room to grow within version 1). An unknown command is not a
 * protocol error: the daemon answers ok:false "unknown command 'x'".
 *
 * Commands (args -> result):
 *   hello       {}  -> {"version":"0.1.0","proto":1,"job":"ID","pid":N}
 *   status      {}  -> the status object below
 *   checkpoint  {"wait":false} -> {"requested":true}
 *               {"wait":true}  -> {"name":"NAME","committed":true} sent once
 *                  the checkpoint is committed (or ok:false if it failed)
 *               {"final":true} -> {"requested":true,"final":true}: a
 *                  preemption by the operator: the final checkpoint, the
 *                  other ranks told as of a notice, exit 75
 *   done        {"dir":"PATH"} -> {"name":"NAME"}: the trainer (or an
 *                  operator) says PATH, a subdirectory of SPOTD_CKPT_DIR,
 *                  is a complete checkpoint; same as creating SPOTD_COMPLETE
 *   step        {"step":N} -> {}: the trainer's current step (an integer
 *                  in [0, 2^53)), recorded in the job history (lost steps)
 *   metrics     {}  -> {"text":"..."}: the daemon's metrics in the
 *                  Prometheus text format (lib/core/metrics.h)
 * (step and metrics were added within version 1: an older daemon answers
 * ok:false "unknown command".)
 *
 * Status object (result of "status"). Times are RFC 3339 UTC strings,
 * durations integer seconds, sizes integer bytes. Objects that do not
 * apply are null (or absent).
 *   "state":     string, the engine's state name: "init", "connecting",
 *                "restoring", "running", "restarting", "draining",
 *                "relaunching", "stopping", "finishing" or "exiting"
 *                (daemon/engine.c); a client shows any other as it is
 *   "job":       string
 *   "store":     string, s3:// URL of the job root
 *   "provider":  "aws" | "gcp" | "azure" | "none"
 *   "notice":    null | {"kind": SPOTD_REASON value ("aws-spot-terminate",
 *                "aws-rebalance", "gcp-preempted", "azure-preempt", ...),
 *                "deadline": time or null, "seconds_left": int or null}
 *   "trainer":   null | {"pid": int, "uptime_s": int, "restart_count": int,
 *                "step": int or null, "steps_per_s": number or null,
 *                "steps_at_risk": int or null} (step: the trainer's last
 *                "step" request)
 *   "last_commit": null | {"name": string, "time": time, "age_s": int}
 *                (age_s is the work at risk)
 *   "upload":    null | {"name": string, "bytes_done": int,
 *                "bytes_total": int, "rate": bytes per second (number),
 *                "eta_s": int or null}
 *   "warnings":  [string, ...] (e.g. "upload cannot finish before the
 *                deadline: the last committed checkpoint is kept")
 *   "relaunch":  [{"time": time, "reason": string, "exit_status": int,
 *                "ok": bool}, ...] attempts of the relaunch step
 * spotd adds members this header does not type, and a client reads them
 * from the JSON itself: "lease" (daemon/lease.c), "restored", "restarts"
 * and "ranks" (daemon/status.c).
 */
#ifndef SPOT_PROTO_H
#define SPOT_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "core/buf.h"

#define SPOT_PROTO_VERSION 1
#define SPOT_PROTO_MAX_LINE (64 * 1024)
#define SPOT_PROTO_MAX_ID ((uint64_t)1 << 53)

enum spot_proto_cmd {
  SPOT_PROTO_CMD_HELLO,
  SPOT_PROTO_CMD_STATUS,
  SPOT_PROTO_CMD_CHECKPOINT,
  SPOT_PROTO_CMD_DONE,
  SPOT_PROTO_CMD_STEP,
  SPOT_PROTO_CMD_METRICS,
  SPOT_PROTO_CMD_LAST, /* also what an unknown command decodes to */
};

/* "status", ...; NULL for SPOT_PROTO_CMD_LAST or out of range. */
const char *spot_proto_cmd_name(int cmd);
/* The command for a name, or SPOT_PROTO_CMD_LAST. */
enum spot_proto_cmd spot_proto_cmd_from_name(const char *name);

enum spot_proto_kind {
  SPOT_PROTO_REQUEST,  /* what spotd reads */
  SPOT_PROTO_RESPONSE, /* what spotctl reads */
};

/* A decoded message. Everything is borrowed: valid during the callback
 * (or until the json root of spot_proto_decode is released). */
struct spot_proto_msg {
  enum spot_proto_kind kind;
  uint64_t id;
  /* SPOT_PROTO_REQUEST */
  enum spot_proto_cmd cmd; /* SPOT_PROTO_CMD_LAST when unknown */
  const char *cmd_name;    /* as sent */
  json_t *args;            /* an object, empty when absent */
  /* Set when args do not fit cmd ("done: 'dir' must be a non-empty
   * string"): answer ok:false with it, the connection may stay. */
  const char *args_error;
  union {
    struct {
      bool wait;
      bool final; /* the operator's preemption of the job */
    } checkpoint;
    struct {
      const char *dir;
    } done;
    struct {
      int64_t step;
    } step;
  } u;
  /* SPOT_PROTO_RESPONSE */
  bool ok;
  json_t *result;    /* ok: an object, empty when absent */
  const char *error; /* !ok */
};

/* Return 0 to go on, a negative errno to stop the feed (it is returned by
 * spot_proto_feed and the reader stays stopped). */
typedef int (*spot_proto_msg_cb)(const struct spot_proto_msg *msg, void *data);

struct spot_proto_reader {
  enum spot_proto_kind expect;
  struct spot_buf line; /* a partial line, capped at SPOT_PROTO_MAX_LINE */
  int err;              /* sticky: 0 or the first error */
  int64_t err_id;       /* id of the message that failed, -1 if unknown */
  char errmsg[200];
};

void spot_proto_reader_init(struct spot_proto_reader *r,
                            enum spot_proto_kind expect);
void spot_proto_reader_fini(struct spot_proto_reader *r);

/* Feeds bytes as they arrive; lines may be split anywhere across feeds.
 * Calls cb once per complete message, in order. Returns 0, or (and keeps
 * returning, without calling cb again):
 *   -EMSGSIZE         a line longer than SPOT_PROTO_MAX_LINE (detected
 *                     as soon as the limit is passed, without a newline)
 *   -EBADMSG          invalid JSON, not an object, a field of the wrong
 *                     type or a missing field
 *   -EPROTONOSUPPORT  "v" is not SPOT_PROTO_VERSION
 *   the callback's negative return.
 * spot_proto_reader_error() then tells why in one line; err_id is the
 * message's id when it could be read (a daemon may answer it before
 * dropping the client, e.g. "unsupported protocol version 2"). */
int spot_proto_feed(struct spot_proto_reader *r, const char *data, size_t len,
                    spot_proto_msg_cb cb, void *cbdata);
const char *spot_proto_reader_error(const struct spot_proto_reader *r);
/* True while a partial line is buffered (EOF now means a truncated
 * message). */
bool spot_proto_reader_pending(const struct spot_proto_reader *r);

/* Decodes one line (without its newline). On success *root holds the
 * JSON (json_decref it when done with msg). Errors as spot_proto_feed,
 * with the reason in err. */
int spot_proto_decode(const char *line, size_t len, enum spot_proto_kind expect,
                      json_t **root, struct spot_proto_msg *msg, char *err,
                      size_t errlen);

/* Encoders append one '\n'-terminated line to out. They borrow args and
 * result (NULL = {}). Return 0, -EINVAL (id out of range, args not an
 * object, unknown cmd), -EMSGSIZE (the line would pass
 * SPOT_PROTO_MAX_LINE), -ENOMEM, or out's -E2BIG. */
int spot_proto_encode_request(struct spot_buf *out, uint64_t id,
                              enum spot_proto_cmd cmd, json_t *args);
int spot_proto_encode_checkpoint(struct spot_buf *out, uint64_t id, bool wait);
/* checkpoint {"final":true} */
int spot_proto_encode_checkpoint_final(struct spot_buf *out, uint64_t id);
int spot_proto_encode_done(struct spot_buf *out, uint64_t id, const char *dir);
int spot_proto_encode_step(struct spot_buf *out, uint64_t id, int64_t step);
int spot_proto_encode_ok(struct spot_buf *out, uint64_t id, json_t *result);
int spot_proto_encode_error(struct spot_buf *out, uint64_t id, const char *fmt,
                            ...) __attribute__((format(printf, 3, 4)));

/* The status object, typed. Strings are borrowed (NULL = absent). */
#define SPOT_PROTO_MAX_WARNINGS 16
#define SPOT_PROTO_MAX_RELAUNCH 8

struct spot_proto_notice {
  const char *kind;
  const char *deadline; /* NULL = unknown */
  int64_t seconds_left; /* -1 = unknown */
};

struct spot_proto_trainer {
  int64_t pid;
  int64_t uptime_s;
  int64_t restart_count;
  /* What the trainer reported ("step" requests); -1 = not reported. */
  int64_t step;
  double steps_per_s;    /* -1 = unknown (fewer than two reports) */
  int64_t steps_at_risk; /* step minus the last committed checkpoint's
                            step (all of step without a commit); -1 =
                            unknown */
};

struct spot_proto_commit {
  const char *name;
  const char *time;
  int64_t age_s;
};

struct spot_proto_upload {
  const char *name;
  uint64_t bytes_done;
  uint64_t bytes_total;
  double rate;   /* bytes per second */
  int64_t eta_s; /* -1 = unknown */
};

struct spot_proto_relaunch {
  const char *time;
  const char *reason;
  int exit_status;
  bool ok;
};

struct spot_proto_status {
  const char *state;
  const char *job;
  const char *store;
  const char *provider;
  bool has_notice, has_trainer, has_last_commit, has_upload;
  struct spot_proto_notice notice;
  struct spot_proto_trainer trainer;
  struct spot_proto_commit last_commit;
  struct spot_proto_upload upload;
  const char *warnings[SPOT_PROTO_MAX_WARNINGS];
  size_t n_warnings;
  struct spot_proto_relaunch relaunch[SPOT_PROTO_MAX_RELAUNCH];
  size_t n_relaunch;
};

/* A new JSON object for st (the daemon passes it to spot_proto_encode_ok
 * and json_decref's it), or NULL when out of memory. */
json_t *spot_proto_status_to_json(const struct spot_proto_status *st);
/* Reads a status object (spotctl). Strings are borrowed from obj. Extra
 * warnings and relaunch entries beyond the caps are left out; unknown
 * fields are ignored. Returns 0 or -EBADMSG with the reason in err. */
int spot_proto_status_from_json(json_t *obj, struct spot_proto_status *st,
                                char *err, size_t errlen);

#endif
