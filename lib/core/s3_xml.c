/* S3 response bodies, parsed with expat. Pure: bytes in, struct out, so
 * it is unit-tested and fuzzed (tests/fuzz/fuzz_s3_xml.c).
 *
 * Element names are matched without namespace processing (S3 puts every
 * element in its default namespace). Only the first three levels matter:
 * root, its children and the fields of list items. */
#include "core/s3_xml.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <expat.h>

#include "core/util.h"

#define TEXT_CAP (64 * 1024)
#define NAME_MAX_LEN 48

struct item {
  char *key;
  char *etag;
  char *last_modified;
  char *upload_id;
  char *initiated;
  char *code;
  char *prefix;
  uint64_t size;
  int number;
};

struct ctx {
  XML_Parser p;
  enum spot__s3_xml_kind kind;
  struct spot__s3_xml_result *out;
  int depth;
  char names[4][NAME_MAX_LEN];
  struct spot_buf text;
  struct item cur;
  int err;
};

static const char *const roots[SPOT__S3_XML_KIND_LAST] = {
    [SPOT__S3_XML_ERROR] = "Error",
    [SPOT__S3_XML_INITIATE] = "InitiateMultipartUploadResult",
    [SPOT__S3_XML_LIST_OBJECTS] = "ListBucketResult",
    [SPOT__S3_XML_LIST_PARTS] = "ListPartsResult",
    [SPOT__S3_XML_LIST_UPLOADS] = "ListMultipartUploadsResult",
    [SPOT__S3_XML_DELETE] = "DeleteResult",
    [SPOT__S3_XML_COMPLETE] = "CompleteMultipartUploadResult",
};

static void
item_clear(struct item *it)
{
  free(it->key);
  free(it->etag);
  free(it->last_modified);
  free(it->upload_id);
  free(it->initiated);
  free(it->code);
  free(it->prefix);
  memset(it, 0, sizeof(*it));
}

static void
fail(struct ctx *c, int err)
{
  if (c->err == 0)
    c->err = err;
  XML_StopParser(c->p, XML_FALSE);
}

static char *
take_text(struct ctx *c)
{
  char *s = strdup(spot_buf_str(&c->text));

  if (s == NULL)
    fail(c, -ENOMEM);
  return s;
}

/* replaces *dst with the current text */
static void
set_text(struct ctx *c, char **dst)
{
  char *s = take_text(c);

  if (s == NULL)
    return;
  free(*dst);
  *dst = s;
}

static bool
parse_u64(const char *s, uint64_t *out)
{
  int64_t v;

  if (spot_parse_int64(s, 0, INT64_MAX, &v) < 0)
    return false;
  *out = (uint64_t)v;
  return true;
}

static bool
parse_bool(const char *s, bool *out)
{
  if (strcmp(s, "true") == 0)
    *out = true;
  else if (strcmp(s, "false") == 0)
    *out = false;
  else
    return false;
  return true;
}

/* Grows *arr (of elem-size items) to hold n+1. */
static void *
grow(struct ctx *c, void *arr, size_t n, size_t elem)
{
  void *p;

  if (n >= SPOT__S3_XML_MAX_ITEMS) {
    fail(c, -E2BIG);
    return NULL;
  }
  p = realloc(arr, (n + 1) * elem);
  if (p == NULL)
    fail(c, -ENOMEM);
  return p;
}

static void XMLCALL
start_cb(void *data, const XML_Char *name, const XML_Char **attrs)
{
  struct ctx *c = data;

  c->depth++;
  if (c->depth < 4) {
    if (spot_strlcpy(c->names[c->depth], name, NAME_MAX_LEN) >= NAME_MAX_LEN)
      c->names[c->depth][0] = '\0'; /* too long: matches nothing */
  }
  spot_buf_reset(&c->text);
  if (c->depth == 1) {
    if (strcmp(name, "Error") == 0)
      c->out->is_error = true;
    else if (strcmp(name, roots[c->kind]) != 0)
      fail(c, -EBADMSG);
  } else if (c->depth == 2) {
    item_clear(&c->cur);
  }
}

static void XMLCALL
text_cb(void *data, const XML_Char *s, int len)
{
  struct ctx *c = data;

  if (c->depth < 2 || c->depth > 3 || len <= 0)
    return;
  if (spot_buf_append(&c->text, s, (size_t)len) < 0)
    fail(c, -EBADMSG);
}

static void
end_field(struct ctx *c, const char *item, const char *field)
{
  const char *t = spot_buf_str(&c->text);
  struct item *it = &c->cur;

  if (strcmp(field, "Key") == 0) {
    set_text(c, &it->key);
  } else if (strcmp(field, "ETag") == 0) {
    set_text(c, &it->etag);
  } else if (strcmp(field, "LastModified") == 0) {
    set_text(c, &it->last_modified);
  } else if (strcmp(field, "UploadId") == 0) {
    set_text(c, &it->upload_id);
  } else if (strcmp(field, "Initiated") == 0) {
    set_text(c, &it->initiated);
  } else if (strcmp(field, "Code") == 0) {
    set_text(c, &it->code);
  } else if (strcmp(field, "Prefix") == 0) {
    set_text(c, &it->prefix);
  } else if (strcmp(field, "Size") == 0) {
    if (!parse_u64(t, &it->size))
      fail(c, -EBADMSG);
  } else if (strcmp(field, "PartNumber") == 0 && strcmp(item, "Part") == 0) {
    int64_t v;

    if (spot_parse_int64(t, 1, 10000, &v) < 0)
      fail(c, -EBADMSG);
    else
      it->number = (int)v;
  }
}

static void
end_item(struct ctx *c, const char *item)
{
  struct spot__s3_xml_result *o = c->out;
  struct item *it = &c->cur;

  if (c->kind == SPOT__S3_XML_LIST_OBJECTS && strcmp(item, "Contents") == 0) {
    struct spot_s3_object_info *a;

    if (it->key == NULL) {
      fail(c, -EBADMSG);
      return;
    }
    a = grow(c, o->objects, o->n_objects, sizeof(*a));
    if (a == NULL)
      return;
    o->objects = a;
    a[o->n_objects].key = it->key;
    a[o->n_objects].size = it->size;
    a[o->n_objects].etag = it->etag != NULL ? it->etag : strdup("");
    a[o->n_objects].last_modified =
        it->last_modified != NULL ? it->last_modified : strdup("");
    o->n_objects++;
    it->key = it->etag = it->last_modified = NULL;
    if (a[o->n_objects - 1].etag == NULL ||
        a[o->n_objects - 1].last_modified == NULL)
      fail(c, -ENOMEM);
  } else if (c->kind == SPOT__S3_XML_LIST_OBJECTS &&
             strcmp(item, "CommonPrefixes") == 0) {
    char **a;

    if (it->prefix == NULL) {
      fail(c, -EBADMSG);
      return;
    }
    a = grow(c, o->prefixes, o->n_prefixes, sizeof(*a));
    if (a == NULL)
      return;
    o->prefixes = a;
    a[o->n_prefixes++] = it->prefix;
    it->prefix = NULL;
  } else if (c->kind == SPOT__S3_XML_LIST_PARTS && strcmp(item, "Part") == 0) {
    struct spot_s3_part_info *a;
    const char *etag = it->etag != NULL ? it->etag : "";

    if (it->number == 0) {
      fail(c, -EBADMSG);
      return;
    }
    a = grow(c, o->parts, o->n_parts, sizeof(*a));
    if (a == NULL)
      return;
    o->parts = a;
    a[o->n_parts].number = it->number;
    a[o->n_parts].size = it->size;
    if (spot_strlcpy(a[o->n_parts].etag, etag, sizeof(a->etag)) >=
        sizeof(a->etag)) {
      fail(c, -EBADMSG);
      return;
    }
    o->n_parts++;
  } else if (c->kind == SPOT__S3_XML_LIST_UPLOADS &&
             strcmp(item, "Upload") == 0) {
    struct spot_s3_upload_info *a;

    if (it->key == NULL || it->upload_id == NULL) {
      fail(c, -EBADMSG);
      return;
    }
    a = grow(c, o->uploads, o->n_uploads, sizeof(*a));
    if (a == NULL)
      return;
    o->uploads = a;
    a[o->n_uploads].key = it->key;
    a[o->n_uploads].upload_id = it->upload_id;
    a[o->n_uploads].initiated =
        it->initiated != NULL ? it->initiated : strdup("");
    o->n_uploads++;
    it->key = it->upload_id = it->initiated = NULL;
    if (a[o->n_uploads - 1].initiated == NULL)
      fail(c, -ENOMEM);
  } else if (c->kind == SPOT__S3_XML_DELETE && strcmp(item, "Error") == 0) {
    char **a;

    if (it->key == NULL) {
      fail(c, -EBADMSG);
      return;
    }
    a = grow(c, o->failed_keys, o->n_failed_keys, sizeof(*a));
    if (a == NULL)
      return;
    o->failed_keys = a;
    a[o->n_failed_keys++] = it->key;
    it->key = NULL;
    if (o->code == NULL && it->code != NULL) {
      o->code = it->code;
      it->code = NULL;
    }
  }
}

/* A direct child of the root that is a plain value. */
static void
end_top(struct ctx *c, const char *name)
{
  struct spot__s3_xml_result *o = c->out;
  const char *t = spot_buf_str(&c->text);

  if (o->is_error) {
    if (strcmp(name, "Code") == 0)
      set_text(c, &o->code);
    else if (strcmp(name, "Message") == 0)
      set_text(c, &o->message);
    return;
  }
  switch (c->kind) {
  case SPOT__S3_XML_INITIATE:
    if (strcmp(name, "UploadId") == 0)
      set_text(c, &o->upload_id);
    break;
  case SPOT__S3_XML_COMPLETE:
    if (strcmp(name, "ETag") == 0)
      set_text(c, &o->etag);
    break;
  case SPOT__S3_XML_LIST_OBJECTS:
  case SPOT__S3_XML_LIST_PARTS:
  case SPOT__S3_XML_LIST_UPLOADS:
    if (strcmp(name, "IsTruncated") == 0) {
      if (!parse_bool(t, &o->truncated))
        fail(c, -EBADMSG);
    } else if (strcmp(name, "NextContinuationToken") == 0 &&
               c->kind == SPOT__S3_XML_LIST_OBJECTS) {
      set_text(c, &o->next_token);
    } else if (strcmp(name, "NextPartNumberMarker") == 0 &&
               c->kind == SPOT__S3_XML_LIST_PARTS) {
      int64_t v;

      if (spot_parse_int64(t, 0, 10000, &v) < 0)
        fail(c, -EBADMSG);
      else
        o->next_part_marker = (int)v;
    } else {
      end_item(c, name);
    }
    break;
  case SPOT__S3_XML_DELETE:
    end_item(c, name);
    break;
  case SPOT__S3_XML_ERROR:
  case SPOT__S3_XML_KIND_LAST:
    break;
  }
}

static void XMLCALL
end_cb(void *data, const XML_Char *name)
{
  struct ctx *c = data;

  if (c->depth == 2)
    end_top(c, name);
  else if (c->depth == 3 && !c->out->is_error)
    end_field(c, c->names[2], name);
  spot_buf_reset(&c->text);
  c->depth--;
}

static void XMLCALL
doctype_cb(void *data, const XML_Char *name, const XML_Char *sysid,
           const XML_Char *pubid, int has_internal_subset)
{
  fail(data, -EBADMSG);
}

int
spot__s3_xml_parse(enum spot__s3_xml_kind kind, const char *xml, size_t len,
                   struct spot__s3_xml_result *out)
{
  struct ctx c;
  int r = 0;

  memset(out, 0, sizeof(*out));
  if ((unsigned)kind >= SPOT__S3_XML_KIND_LAST)
    return -EINVAL;
  if (len > SPOT__S3_XML_CAP || len > (size_t)INT32_MAX)
    return -E2BIG;
  memset(&c, 0, sizeof(c));
  c.kind = kind;
  c.out = out;
  spot_buf_init(&c.text, TEXT_CAP);
  c.p = XML_ParserCreate("UTF-8");
  if (c.p == NULL)
    return -ENOMEM;
  XML_SetUserData(c.p, &c);
  XML_SetElementHandler(c.p, start_cb, end_cb);
  XML_SetCharacterDataHandler(c.p, text_cb);
  XML_SetStartDoctypeDeclHandler(c.p, doctype_cb);
  if (XML_Parse(c.p, xml, (int)len, XML_TRUE) != XML_STATUS_OK && c.err == 0)
    c.err = -EBADMSG;
  r = c.err;
  if (r == 0 && out->is_error && out->code == NULL)
    r = -EBADMSG; /* an <Error> without a Code says nothing */
  if (r == 0 && kind == SPOT__S3_XML_INITIATE && !out->is_error &&
      (out->upload_id == NULL || out->upload_id[0] == '\0'))
    r = -EBADMSG;
  if (r == 0 && out->truncated && kind == SPOT__S3_XML_LIST_OBJECTS &&
      (out->next_token == NULL || out->next_token[0] == '\0'))
    r = -EBADMSG; /* truncated without a way to go on: would loop */
  XML_ParserFree(c.p);
  item_clear(&c.cur);
  spot_buf_fini(&c.text);
  if (r < 0)
    spot__s3_xml_result_fini(out);
  return r;
}

void
spot__s3_xml_result_fini(struct spot__s3_xml_result *r)
{
  for (size_t i = 0; i < r->n_objects; i++) {
    free((char *)r->objects[i].key);
    free((char *)r->objects[i].etag);
    free((char *)r->objects[i].last_modified);
  }
  free(r->objects);
  for (size_t i = 0; i < r->n_prefixes; i++)
    free(r->prefixes[i]);
  free(r->prefixes);
  free(r->parts);
  for (size_t i = 0; i < r->n_uploads; i++) {
    free((char *)r->uploads[i].key);
    free((char *)r->uploads[i].upload_id);
    free((char *)r->uploads[i].initiated);
  }
  free(r->uploads);
  for (size_t i = 0; i < r->n_failed_keys; i++)
    free(r->failed_keys[i]);
  free(r->failed_keys);
  free(r->code);
  free(r->message);
  free(r->upload_id);
  free(r->etag);
  free(r->next_token);
  memset(r, 0, sizeof(*r));
}

int
spot__xml_escape(const char *s, struct spot_buf *out)
{
  int r = 0;

  for (; r == 0 && *s != '\0'; s++) {
    unsigned char ch = (unsigned char)*s;

    if (ch < 0x20 && ch != '\t' && ch != '\n' && ch != '\r')
      return -EINVAL;
    switch (ch) {
    case '&':
      r = spot_buf_appends(out, "&amp;");
      break;
    case '<':
      r = spot_buf_appends(out, "&lt;");
      break;
    case '>':
      r = spot_buf_appends(out, "&gt;");
      break;
    case '"':
      r = spot_buf_appends(out, "&quot;");
      break;
    case '\'':
      r = spot_buf_appends(out, "&apos;");
      break;
    case '\r':
      r = spot_buf_appends(out, "&#13;");
      break;
    default:
      r = spot_buf_append(out, s, 1);
      break;
    }
  }
  return r;
}
