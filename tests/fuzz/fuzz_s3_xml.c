/* libFuzzer target: the S3 response parser (lib/s3_xml.c) for every kind.
 * The first byte picks the kind, the rest is the body, so one corpus
 * covers all kinds. Checks the invariants a caller relies on, and that
 * an error's Code and Message, escaped as lib/s3.c does before printing
 * them (spot_escape), hold no control character, no C1 control, no bidi
 * override and only valid UTF-8, and that escaping again changes
 * nothing. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/s3_xml.h"
#include "printable.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  struct spot__s3_xml_result r;
  enum spot__s3_xml_kind kind;

  if (size < 1)
    return 0;
  kind = (enum spot__s3_xml_kind)(data[0] % SPOT__S3_XML_KIND_LAST);
  if (spot__s3_xml_parse(kind, (const char *)data + 1, size - 1, &r) == 0) {
    /* what finish() hands to users must be consistent */
    if (r.is_error && r.code == NULL)
      __builtin_trap();
    if (r.is_error) {
      check_printable(r.code);
      check_printable(r.message != NULL ? r.message : "");
    }
    for (size_t i = 0; i < r.n_objects; i++)
      if (r.objects[i].key == NULL || r.objects[i].etag == NULL ||
          r.objects[i].last_modified == NULL)
        __builtin_trap();
    for (size_t i = 0; i < r.n_parts; i++)
      if (r.parts[i].number < 1 || r.parts[i].number > 10000 ||
          strnlen(r.parts[i].etag, sizeof(r.parts[i].etag)) ==
              sizeof(r.parts[i].etag))
        __builtin_trap();
    if (r.truncated && kind == SPOT__S3_XML_LIST_OBJECTS &&
        (r.next_token == NULL || r.next_token[0] == '\0'))
      __builtin_trap();
  }
  spot__s3_xml_result_fini(&r);
  return 0;
}
