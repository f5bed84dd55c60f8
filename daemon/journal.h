/* journal.c: the journal scan: an upload a killed spotd left. */
#ifndef SPOTD_JOURNAL_H
#define SPOTD_JOURNAL_H

#include <stdbool.h>
#include <stddef.h>

struct spotd;

/* journal.c: the newest complete checkpoint a killed spotd was uploading
 * (its journal), into name; false when there is none. */
bool journal_find(struct spotd *d, char *name, size_t size);

#endif
