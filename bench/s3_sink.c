/* s3_sink - bench/s3_discard.py in C (libmicrohttpd, a thread per
 * connection): a loopback S3 stand-in that accepts and discards every
 * body, cheap enough that on 2 cores the client, not the sink, sets the
 * ceiling of `spotctl push`. It answers what a push needs: HEAD and GET of
 * an object 404, PUT 200 + ETag, POST ?uploads an upload id, POST
 * ?uploadId a completion, GET ?uploads and ?list-type=2 empty lists,
 * DELETE 204. No signature check, nothing stored. Not a test.
 *
 *   s3_sink [PORT]     (0 or nothing: a free port, printed on stdout)
 *
 * Serves until SIGTERM or SIGINT; prints the bytes it drained on stderr. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mhd_serve.h"

static atomic_ullong drained;
static atomic_ullong ids;

static enum MHD_Result
reply(struct MHD_Connection *c, unsigned code, const char *body, bool etag)
{
  char copy[256]; /* MHD takes a non-const buffer, and copies it */
  struct MHD_Response *r;
  enum MHD_Result ret;
  char tag[48];

  snprintf(copy, sizeof(copy), "%s", body);
  r = MHD_create_response_from_buffer(strlen(copy), copy,
                                      MHD_RESPMEM_MUST_COPY);

  if (r == NULL)
    return MHD_NO;
  MHD_add_response_header(r, "Content-Type", "application/xml");
  if (etag) {
    snprintf(tag, sizeof(tag), "\"%032llx\"", (unsigned long long)++ids);
    MHD_add_response_header(r, "ETag", tag);
  }
  ret = MHD_queue_response(c, code, r);
  MHD_destroy_response(r);
  return ret;
}

static bool
has_arg(struct MHD_Connection *c, const char *key)
{
  return MHD_lookup_connection_value_n(c, MHD_GET_ARGUMENT_KIND, key,
                                       strlen(key), NULL, NULL) == MHD_YES;
}

static enum MHD_Result
handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
       const char *version, const char *data, size_t *data_len, void **state)
{
  static int started;
  char body[256];

  (void)cls;
  (void)url;
  (void)version;
  (void)data;
  if (*state == NULL) {
    *state = &started; /* the headers: the body (if any) comes next */
    return MHD_YES;
  }
  if (*data_len > 0) {
    drained += *data_len;
    *data_len = 0;
    return MHD_YES;
  }
  if (strcmp(method, "PUT") == 0)
    return reply(c, MHD_HTTP_OK, "", true);
  if (strcmp(method, "POST") == 0) {
    if (has_arg(c, "uploads"))
      snprintf(body, sizeof(body),
               "<InitiateMultipartUploadResult><UploadId>%032llx</UploadId>"
               "</InitiateMultipartUploadResult>",
               (unsigned long long)++ids);
    else
      snprintf(body, sizeof(body),
               "<CompleteMultipartUploadResult><ETag>\"%032llx-1\"</ETag>"
               "</CompleteMultipartUploadResult>",
               (unsigned long long)++ids);
    return reply(c, MHD_HTTP_OK, body, false);
  }
  if (strcmp(method, "DELETE") == 0)
    return reply(c, MHD_HTTP_NO_CONTENT, "", false);
  if (strcmp(method, "GET") == 0 && has_arg(c, "uploads"))
    return reply(c, MHD_HTTP_OK,
                 "<ListMultipartUploadsResult><IsTruncated>false</IsTruncated>"
                 "</ListMultipartUploadsResult>",
                 false);
  if (strcmp(method, "GET") == 0 && has_arg(c, "list-type"))
    return reply(c, MHD_HTTP_OK,
                 "<ListBucketResult><IsTruncated>false</IsTruncated>"
                 "<KeyCount>0</KeyCount></ListBucketResult>",
                 false);
  return reply(c, MHD_HTTP_NOT_FOUND,
               strcmp(method, "HEAD") == 0
                   ? ""
                   : "<Error><Code>NoSuchKey</Code></Error>",
               false);
}

int
main(int argc, char **argv)
{
  unsigned long port = 0;
  char *end = NULL;

  if (argc > 1 &&
      (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
    printf("usage: s3_sink [PORT]\n"
           "A loopback S3 stand-in that discards every body (a bench tool, "
           "not a test).\nPORT 0 or none: a free port, printed on stdout.\n");
    return 0;
  }
  if (argc > 1)
    port = strtoul(argv[1], &end, 10);
  if (argc > 2 || (argc > 1 && (end == argv[1] || *end != '\0')) ||
      port > 65535) {
    fprintf(stderr, "usage: s3_sink [PORT]\n");
    return 2;
  }
  if (mhd_serve("s3_sink", (unsigned)port, handle, NULL) != 0)
    return 1;
  fprintf(stderr, "s3_sink: drained %llu bytes\n", (unsigned long long)drained);
  return 0;
}
