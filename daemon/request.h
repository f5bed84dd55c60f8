/* request.c: the checkpoint request: the request file, the signal to the
 * processes of the trainer's tree that catch it (enum req_state). */
#ifndef SPOTD_REQUEST_H
#define SPOTD_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "io/proctree.h"
#include "core/reqfile.h"

struct spotd;
struct req_proc;

/* The checkpoint request as the trainer sees it (request.c). */
enum req_state {
  REQ_IDLE,
  REQ_PENDING, /* seq asked, not served yet */
  REQ_STATE_LAST,
};

struct ckpt_req {
  enum req_state state;
  char path[4200]; /* the request file ("" none) */
  int fd;          /* read and written with pread/pwrite, never mapped */
  void *map;       /* spotd's own mapping, never touched: its map_id */
  char map_id[64]; /* "DEV INODE" as /proc/PID/maps shows the file */
  char env_id[48]; /* "DEV:INO" of fstat(): SPOTD_REQUEST_ID */
  bool tampered;   /* told once: someone else wrote into the file */
  uint64_t seq;
  uv_timer_t resend;     /* while pending: processes that start catching */
  uv_timer_t timeout;    /* while pending: --ckpt-timeout */
  uint64_t signal_mono;  /* when the pending (or last) request was made */
  uint64_t last_save_ms; /* request to complete, the last one served (0:
                            none yet): the estimate of the next save */
  /* The processes of the trainer's tree that catch or ignore the signal,
   * or got it for the request pending, as of the last scan, sorted by
   * pid (request.c): one entry per process, as many as the tree holds. */
  struct req_proc *procs;
  size_t nprocs;
  /* the DEADLINE slot: unix ms, 0 none (reqfile.h) */
  int64_t deadline_ms;
};

/* request.c: the request file and the checkpoint signal */
/* Creates and maps the request file (a failure is a warning: signals
 * only). 0, or negative errno for the timer. */
int request_open(struct spotd *d);
void request_close(struct spotd *d); /* its handle */
void request_fini(struct spotd *d);  /* after the loop: unmap, remove */
/* The trainer starts: no request, no poll yet. */
void request_trainer_starts(struct spotd *d);
/* The path for SPOTD_REQUEST_FILE, or NULL. */
const char *request_file(const struct spotd *d);
/* The file's identity for SPOTD_REQUEST_ID ("DEV:INO"), or NULL. */
const char *request_file_id(const struct spotd *d);
/* A new request: in the file, and the signal to the processes that catch
 * or ignore it. *helpers: how many processes the helper serves; *caught:
 * how many catch the signal; *sent: how many got it. */
void request_begin(struct spotd *d, unsigned *helpers, unsigned *caught,
                   unsigned *sent);
/* The time by which the trainer's checkpoint must be complete (unix ms,
 * 0 none): in the file now, and with every later request. */
void request_set_deadline(struct spotd *d, int64_t wall_ms);
/* The request's own timer (its timeout), on d->loop: spotd_handles_init()
 * calls it, request_close() closes it. */
void request_handles_init(struct spotd *d);
/* Asks the trainer for a checkpoint (why: for the log and the history):
 * a new request, its timeout started; nothing when the trainer is not
 * running or one is pending already. */
void spotd_request_checkpoint(struct spotd *d, const char *why);
/* A checkpoint folder completed: a pending request is served (its time
 * kept for the estimate). */
void request_completed(struct spotd *d);
/* The pending request is dropped: the trainer is gone, the final
 * checkpoint's time is up, or it timed out. */
void request_drop(struct spotd *d);
/* A request was made and is not over yet (REQ_PENDING). */
bool request_pending(const struct spotd *d);
const char *req_state_name(enum req_state s);
/* The helper is in use, no process it does not serve catches the signal,
 * and no helper has polled since the trainer started: the trainer has made
 * no step. */
bool request_no_step(struct spotd *d);

#endif
