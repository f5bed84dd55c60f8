/* control.c: the control socket (JSON lines, SO_PEERCRED). */
#ifndef SPOTD_CONTROL_H
#define SPOTD_CONTROL_H

struct spotd;

struct ctl_conn;

int control_start(struct spotd *d);
void control_close(struct spotd *d);
void control_commit_event(struct spotd *d, const char *name, int err,
                          const char *msg);

#endif
