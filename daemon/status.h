/* status.c: `spotctl status`. */
#ifndef SPOTD_STATUS_H
#define SPOTD_STATUS_H

#include <jansson.h>
#include <stdint.h>

struct spotd;

/* The reply to `spotctl status`. */
json_t *spotd_status_json(struct spotd *d);
/* A step the trainer reported (control "step"). */
void status_step(struct spotd *d, int64_t step);

#endif
