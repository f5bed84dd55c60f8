/* S3 response bodies parsed with expat: pure (no I/O), shared by the S3
 * client (io/s3.c), the unit tests and the fuzz target. */
#ifndef SPOT_S3_XML_H
#define SPOT_S3_XML_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/buf.h"

struct spot_s3_part_info {
  int number;
  char etag[128];
  uint64_t size;
};

struct spot_s3_object_info {
  const char *key;
  uint64_t size;
  const char *etag;
  const char *last_modified; /* as the server wrote it, ISO 8601 */
};

struct spot_s3_upload_info {
  const char *key;
  const char *upload_id;
  const char *initiated;
};

/* Response bodies we parse are capped: S3 never sends XML this big for
 * the calls we make (1000 keys of 1 KiB is ~1.5 MiB). */
#define SPOT__S3_XML_CAP (8u * 1024 * 1024)
/* Items in one list response; S3 caps pages at 1000. */
#define SPOT__S3_XML_MAX_ITEMS 10000

enum spot__s3_xml_kind {
  SPOT__S3_XML_ERROR,        /* <Error> only */
  SPOT__S3_XML_INITIATE,     /* InitiateMultipartUploadResult */
  SPOT__S3_XML_LIST_OBJECTS, /* ListBucketResult (V2) */
  SPOT__S3_XML_LIST_PARTS,   /* ListPartsResult */
  SPOT__S3_XML_LIST_UPLOADS, /* ListMultipartUploadsResult */
  SPOT__S3_XML_DELETE,       /* DeleteResult */
  SPOT__S3_XML_COMPLETE,     /* CompleteMultipartUploadResult */
  SPOT__S3_XML_KIND_LAST,
};

struct spot__s3_xml_result {
  bool is_error; /* the root was <Error> (any kind accepts it) */
  char *code;    /* Error/Code, or the first DeleteResult/Error/Code */
  char *message;
  char *upload_id;                     /* initiate */
  char *etag;                          /* complete */
  bool truncated;                      /* IsTruncated */
  char *next_token;                    /* list objects: NextContinuationToken */
  int next_part_marker;                /* list parts */
  struct spot_s3_object_info *objects; /* strings owned */
  size_t n_objects;
  char **prefixes;
  size_t n_prefixes;
  struct spot_s3_part_info *parts;
  size_t n_parts;
  struct spot_s3_upload_info *uploads; /* strings owned */
  size_t n_uploads;
  char **failed_keys;
  size_t n_failed_keys;
};

/* Parses one S3 response body of the expected kind. Returns 0 (out
 * filled; out->is_error tells an <Error> body), -EBADMSG for malformed or
 * unexpected XML (DOCTYPEs are refused), -ENOMEM or -E2BIG. out is always
 * safe to pass to spot__s3_xml_result_fini() afterwards. */
int spot__s3_xml_parse(enum spot__s3_xml_kind kind, const char *xml, size_t len,
                       struct spot__s3_xml_result *out);
void spot__s3_xml_result_fini(struct spot__s3_xml_result *r);

/* XML-escapes s into out (&, <, >, ", '). -EINVAL for control characters
 * XML 1.0 cannot carry. */
int spot__xml_escape(const char *s, struct spot_buf *out);

#endif
