/* probe.c: the store check of the startup (PUT, GET, DELETE a probe). */
#ifndef SPOTD_PROBE_H
#define SPOTD_PROBE_H

struct spotd;

/* The store check; restore_probed() follows. */
void probe_start(struct spotd *d);
/* After the loop: frees the probe's key (probe_start() made it). */
void probe_fini(struct spotd *d);

#endif
