/* libFuzzer target for the manifest parser: untrusted JSON must be
 * rejected cleanly or accepted, and an accepted manifest must serialize,
 * parse back, and serialize to the same text. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/manifest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  struct spot_manifest *m, *m2;
  char err[256], *j1, *j2;

  if (spot_manifest_parse((const char *)data, size, &m, err, sizeof(err)) < 0)
    return 0;
  if (spot_manifest_to_json(m, &j1, err, sizeof(err)) != 0)
    abort();
  if (spot_manifest_parse(j1, strlen(j1), &m2, err, sizeof(err)) != 0)
    abort();
  if (spot_manifest_to_json(m2, &j2, err, sizeof(err)) != 0)
    abort();
  if (strcmp(j1, j2) != 0 || m->nfiles != m2->nfiles ||
      m->total_raw != m2->total_raw || m->total_stored != m2->total_stored ||
      m->total_ref_raw != m2->total_ref_raw || m->nrefs != m2->nrefs)
    abort();
  free(j1);
  free(j2);
  spot_manifest_free(m);
  spot_manifest_free(m2);
  return 0;
}
