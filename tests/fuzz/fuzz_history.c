/* libFuzzer target for the job history: an untrusted event must be
 * rejected cleanly or accepted, and an accepted one must encode, parse
 * back and encode to the same text; a list of accepted events must
 * summarize, with no negative total. Every string spotctl history prints
 * comes out of spot_escape() printable (printable.h). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/history.h"
#include "printable.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  struct spot_hist_event ev[8], back;
  struct spot_hist_summary s;
  size_t n = 0, off = 0;
  char err[256], *j1, *j2;

  /* Events separated by newlines, at most 8. */
  while (off < size && n < 8) {
    const uint8_t *nl = memchr(data + off, '\n', size - off);
    size_t len = nl != NULL ? (size_t)(nl - data) - off : size - off;

    if (spot_hist_parse((const char *)data + off, len, &ev[n], err,
                        sizeof(err)) == 0) {
      if (spot_hist_encode(&ev[n], &j1) != 0)
        abort();
      if (spot_hist_parse(j1, strlen(j1), &back, err, sizeof(err)) != 0)
        abort();
      if (spot_hist_encode(&back, &j2) != 0 || strcmp(j1, j2) != 0)
        abort();
      free(j1);
      free(j2);
      check_printable(ev[n].owner);
      check_printable(ev[n].host);
      check_printable(ev[n].kind);
      check_printable(ev[n].checkpoint);
      n++;
    }
    off += len + 1;
  }
  spot_hist_sort(ev, n);
  if (spot_hist_summarize(ev, n, 0.5, 1.5, &s) == 0) {
    if (s.nruns > n || s.nnodes > n || s.nruns > s.nnodes ||
        s.trained_runs + s.refused != s.nruns || s.lost_ms < 0 ||
        s.gap_ms < 0 || s.train_ms < 0 || s.node_ms < 0 || s.wall_ms < 0 ||
        s.lease_wait_ms < 0)
      abort();
    for (size_t i = 0; i < s.nnodes; i++)
      if (s.nodes[i].run >= s.nruns)
        abort();
    if (spot_hist_summary_json(&s, "job", ev, n, &j1) == 0)
      free(j1);
    spot_hist_summary_fini(&s);
  }
  return 0;
}
