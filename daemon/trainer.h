/* trainer.c: the training command on lib/io/child.c. */
#ifndef SPOTD_TRAINER_H
#define SPOTD_TRAINER_H

#include <stdbool.h>
#include <stdint.h>

struct spotd;

int trainer_start(struct spotd *d);
bool trainer_running(const struct spotd *d);
void trainer_stop(struct spotd *d, uint64_t grace_ms);

#endif
