/* probe.c: the store check of the startup (PUT, GET, DELETE a probe). */
#ifndef SPOTD_PROBE_H
#define SPOTD_PROBE_H

struct spotd;

/* The store check; restore_probed() follows. */
void probe_start(struct spotd *d);

#endif
