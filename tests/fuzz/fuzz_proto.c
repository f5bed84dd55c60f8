/* libFuzzer target: the control protocol reader, both directions, fed in
 * pieces whose sizes come from the input, plus the status decoder and an
 * encode/decode round trip of every request it accepts. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/buf.h"
#include "core/proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int
request_cb(const struct spot_proto_msg *m, void *data)
{
  struct spot_buf out;
  struct spot_proto_msg again;
  json_t *root;
  char err[256];

  (void)data;
  if (m->cmd >= SPOT_PROTO_CMD_LAST || m->args_error != NULL)
    return 0;
  /* A request we accept, encoded again, decodes to the same command. */
  spot_buf_init(&out, 2 * SPOT_PROTO_MAX_LINE);
  if (spot_proto_encode_request(&out, m->id, m->cmd, m->args) == 0) {
    if (out.len == 0 || out.data[out.len - 1] != '\n' ||
        memchr(out.data, '\n', out.len - 1) != NULL)
      abort();
    if (spot_proto_decode(out.data, out.len - 1, SPOT_PROTO_REQUEST, &root,
                          &again, err, sizeof(err)) != 0 ||
        again.cmd != m->cmd || again.id != m->id)
      abort();
    json_decref(root);
  }
  spot_buf_reset(&out);
  if (spot_proto_encode_error(&out, m->id, "unknown command '%s'",
                              m->cmd_name) != 0)
    abort();
  spot_buf_fini(&out);
  return 0;
}

static int
response_cb(const struct spot_proto_msg *m, void *data)
{
  struct spot_proto_status st;
  char err[256];

  (void)data;
  if (m->ok)
    spot_proto_status_from_json(m->result, &st, err, sizeof(err));
  return 0;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  struct spot_proto_reader rq, rs;
  size_t chunk, off = 0;

  if (size < 1)
    return 0;
  /* First byte: the feed size (1..256), so every split point gets tried. */
  chunk = (size_t)data[0] + 1;
  data++;
  size--;
  spot_proto_reader_init(&rq, SPOT_PROTO_REQUEST);
  spot_proto_reader_init(&rs, SPOT_PROTO_RESPONSE);
  while (off < size) {
    size_t n = size - off < chunk ? size - off : chunk;
    int a = spot_proto_feed(&rq, (const char *)data + off, n, request_cb, NULL);
    int b =
        spot_proto_feed(&rs, (const char *)data + off, n, response_cb, NULL);
    if (a < 0 && b < 0)
      break;
    off += n;
  }
  if ((rq.err != 0 && spot_proto_reader_error(&rq)[0] == '\0') ||
      rq.line.len > SPOT_PROTO_MAX_LINE)
    abort();
  spot_proto_reader_fini(&rq);
  spot_proto_reader_fini(&rs);
  return 0;
}
