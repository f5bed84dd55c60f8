#include "cmocka-compat.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/codec.h"
#include "core/manifest.h"

#define ARRAY_N(a) (sizeof(a) / sizeof((a)[0]))

/* 2026-12-02T10:13:50Z */
#define CREATED_MS INT64_C(1796206430000)

/* A valid manifest: one file of two frames, one empty file. */
static const char base[] =
    "{\"format\":\"spotd-checkpoint\",\"version\":1,\"name\":\"step-100\","
    "\"job\":\"job1\",\"created\":\"2026-12-02T10:13:50Z\","
    "\"totals\":{\"files\":2,\"raw_bytes\":10,\"stored_bytes\":35},"
    "\"files\":["
    "{\"path\":\"a/b.bin\",\"size\":10,\"mode\":420,\"mtime_ns\":123,"
    "\"filter\":\"bytegroup4\",\"key\":\"a/b.bin.zst\",\"frames\":["
    "{\"raw_off\":0,\"raw_len\":6,\"comp_off\":0,\"comp_len\":20,"
    "\"crc32c\":4294967295},"
    "{\"raw_off\":6,\"raw_len\":4,\"comp_off\":20,\"comp_len\":15,"
    "\"crc32c\":7}]},"
    "{\"path\":\"e\",\"size\":0,\"mode\":384,\"mtime_ns\":-5,"
    "\"filter\":\"none\",\"frames\":[]}]}";

/* base with the first occurrence of from replaced by to */
static char *
subst(const char *from, const char *to)
{
  const char *p = strstr(base, from);
  size_t n = strlen(base) - strlen(from) + strlen(to) + 1;
  char *s = malloc(n);

  assert_non_null(p);
  assert_non_null(s);
  snprintf(s, n, "%.*s%s%s", (int)(p - base), base, to, p + strlen(from));
  return s;
}

/* A valid packed manifest: two small files in one pack (a gap between
 * them, as the padding of a pack's part leaves), one big file of its own,
 * packs listed before files. */
static const char packed[] =
    "{\"format\":\"spotd-checkpoint\",\"version\":1,\"name\":\"step-100\","
    "\"job\":\"job1\",\"created\":\"2026-12-02T10:13:50Z\","
    "\"totals\":{\"files\":3,\"raw_bytes\":20,\"stored_bytes\":45},"
    "\"packs\":[{\"key\":\"packs/pack-000001.pack\",\"stored\":100}],"
    "\"files\":["
    "{\"path\":\"a\",\"size\":5,\"mode\":420,\"mtime_ns\":1,"
    "\"filter\":\"none\",\"pack\":\"packs/pack-000001.pack\",\"frames\":["
    "{\"raw_off\":0,\"raw_len\":5,\"comp_off\":0,\"comp_len\":14,"
    "\"crc32c\":1}]},"
    "{\"path\":\"b\",\"size\":10,\"mode\":420,\"mtime_ns\":2,"
    "\"filter\":\"none\",\"key\":\"b.zst\",\"frames\":["
    "{\"raw_off\":0,\"raw_len\":10,\"comp_off\":0,\"comp_len\":19,"
    "\"crc32c\":2}]},"
    "{\"path\":\"c\",\"size\":5,\"mode\":420,\"mtime_ns\":3,"
    "\"filter\":\"none\",\"pack\":\"packs/pack-000001.pack\",\"frames\":["
    "{\"raw_off\":0,\"raw_len\":3,\"comp_off\":60,\"comp_len\":6,"
    "\"crc32c\":3},"
    "{\"raw_off\":3,\"raw_len\":2,\"comp_off\":66,\"comp_len\":6,"
    "\"crc32c\":4}]}]}";

/* packed with the first occurrence of from replaced by to */
static char *
psubst(const char *from, const char *to)
{
  const char *p = strstr(packed, from);
  size_t n = strlen(packed) - strlen(from) + strlen(to) + 1;
  char *s = malloc(n);

  assert_non_null(p);
  assert_non_null(s);
  snprintf(s, n, "%.*s%s%s", (int)(p - packed), packed, to, p + strlen(from));
  return s;
}

static void
test_packs_parse(void **state)
{
  struct spot_manifest *m = NULL;
  const struct spot_manifest_file *f;
  char err[256] = "", *json = NULL;

  (void)state;
  assert_int_equal(
      spot_manifest_parse(packed, strlen(packed), &m, err, sizeof(err)), 0);
  assert_int_equal(m->npacks, 1);
  assert_string_equal(m->packs[0].key, "packs/pack-000001.pack");
  assert_int_equal(m->packs[0].stored, 100);
  f = spot_manifest_find(m, "a");
  assert_int_equal(f->pack, 1);
  assert_null(f->key);
  assert_int_equal(f->pack_off, 0);
  assert_int_equal(f->stored, 14);
  assert_string_equal(spot_manifest_object_key(m, f), "packs/pack-000001.pack");
  f = spot_manifest_find(m, "c");
  assert_int_equal(f->pack_off, 60);
  assert_int_equal(f->stored, 12);
  f = spot_manifest_find(m, "b");
  assert_int_equal(f->pack, 0);
  assert_string_equal(spot_manifest_object_key(m, f), "b.zst");
  /* written back the same */
  assert_int_equal(spot_manifest_to_json(m, &json, err, sizeof(err)), 0);
  assert_string_equal(json, packed);
  free(json);
  spot_manifest_free(m);
}

static void
test_packs_build(void **state)
{
  struct spot_manifest *m = NULL, *back = NULL;
  char err[256] = "", *json = NULL;
  size_t p0, p1, a, b, c;

  (void)state;
  assert_int_equal(spot_manifest_new("ck", "job", CREATED_MS, &m), 0);
  assert_int_equal(
      spot_manifest_add_pack(m, "x/packs/pack-000001.pack", 0, &p0), 0);
  assert_int_equal(
      spot_manifest_add_pack(m, "x/packs/pack-000002.pack", 0, &p1), 0);
  assert_int_equal(spot_manifest_add_pack(m, "MANIFEST.json", 0, NULL),
                   -EINVAL);
  assert_int_equal(spot_manifest_add_pack(m, "../p", 0, NULL), -EINVAL);
  assert_int_equal(spot_manifest_add_packed(m, "a", p0, 0, 100, 0644, 1, 0, &a),
                   0);
  assert_int_equal(spot_manifest_add_packed(m, "b", p1, 0, 50, 0644, 1, 0, &b),
                   0);
  assert_int_equal(spot_manifest_add_packed(m, "c", p0, 0, 70, 0644, 1, 0, &c),
                   0);
  /* empty, or a pack that does not exist */
  assert_int_equal(spot_manifest_add_packed(m, "d", p0, 0, 0, 0644, 1, 0, NULL),
                   -EINVAL);
  assert_int_equal(spot_manifest_add_packed(m, "d", 7, 0, 1, 0644, 1, 0, NULL),
                   -EINVAL);
  assert_int_equal(spot_manifest_set_pack_off(m, 99, 0), -EINVAL);
  assert_int_equal(spot_manifest_set_frame(m, a, 0, 100, 40, 1), 0);
  assert_int_equal(spot_manifest_set_frame(m, b, 0, 50, 30, 2), 0);
  assert_int_equal(spot_manifest_set_frame(m, c, 0, 60, 20, 3), 0);
  assert_int_equal(spot_manifest_set_frame(m, c, 1, 10, 5, 4), 0);
  /* stored sizes not set yet: refused */
  assert_int_equal(spot_manifest_to_json(m, &json, err, sizeof(err)), -EINVAL);
  assert_non_null(strstr(err, "packs[0].stored"));
  assert_int_equal(spot_manifest_set_pack_stored(m, p0, 200), 0);
  assert_int_equal(spot_manifest_set_pack_stored(m, p1, 30), 0);
  assert_int_equal(spot_manifest_set_pack_stored(m, 5, 30), -EINVAL);
  /* c overlaps a */
  assert_int_equal(spot_manifest_set_pack_off(m, c, 39), 0);
  assert_int_equal(spot_manifest_to_json(m, &json, err, sizeof(err)), -EINVAL);
  assert_non_null(strstr(err, "overlap"));
  /* c ends past its pack */
  assert_int_equal(spot_manifest_set_pack_off(m, c, 180), 0);
  assert_int_equal(spot_manifest_to_json(m, &json, err, sizeof(err)), -EINVAL);
  assert_non_null(strstr(err, "outside its pack"));
  assert_int_equal(spot_manifest_set_pack_off(m, c, 40), 0);
  assert_int_equal(spot_manifest_to_json(m, &json, err, sizeof(err)), 0);
  assert_int_equal(
      spot_manifest_parse(json, strlen(json), &back, err, sizeof(err)), 0);
  assert_int_equal(back->npacks, 2);
  assert_int_equal(back->files[2].pack, 1);
  assert_int_equal(back->files[2].frames[0].comp_off, 40);
  assert_int_equal(back->files[2].frames[1].comp_off, 60);
  assert_int_equal(back->total_stored, 95);
  spot_manifest_free(back);
  free(json);
  /* a file key may not be a pack's */
  assert_int_equal(spot_manifest_add_file(m, "e", "x/packs/pack-000001.pack", 1,
                                          0644, 1, 0, &a),
                   0);
  assert_int_equal(spot_manifest_set_frame(m, a, 0, 1, 10, 1), 0);
  assert_int_equal(spot_manifest_to_json(m, &json, err, sizeof(err)), -EINVAL);
  assert_non_null(strstr(err, "same object"));
  spot_manifest_free(m);
}

static void
test_packs_reject(void **state)
{
  static const struct {
    const char *from, *to, *want;
  } cases[] = {
      /* a packed file's frames must be contiguous */
      {"\"comp_off\":66", "\"comp_off\":67", "contiguous"},
      /* inside the pack */
      {"\"stored\":100", "\"stored\":71", "outside its pack"},
      {"\"comp_off\":60", "\"comp_off\":95", "contiguous"},
      /* no overlap of two files in one pack */
      {"\"comp_off\":60,\"comp_len\":6,\"crc32c\":3},"
       "{\"raw_off\":3,\"raw_len\":2,\"comp_off\":66",
       "\"comp_off\":10,\"comp_len\":6,\"crc32c\":3},"
       "{\"raw_off\":3,\"raw_len\":2,\"comp_off\":16",
       "overlap"},
      /* names a pack that is not listed */
      {"\"pack\":\"packs/pack-000001.pack\"", "\"pack\":\"packs/other\"",
       "not in packs"},
      /* key and pack both */
      {"\"pack\":\"packs/pack-000001.pack\"",
       "\"key\":\"a.zst\",\"pack\":\"packs/pack-000001.pack\"", "no key"},
      /* pack keys follow the key rules */
      {"\"key\":\"packs/pack-000001.pack\"", "\"key\":\"../x\"",
       "packs[0].key"},
      {"\"stored\":100", "\"stored\":0", "packs[0].stored"},
      {"\"stored\":100}", "\"stored\":100,\"x\":1}", "unknown key"},
      {"\"packs\":[{\"key\":\"packs/pack-000001.pack\",\"stored\":100}]",
       "\"packs\":7", "not an array"},
      /* a pack key that is a file's key */
      {"\"key\":\"b.zst\"", "\"key\":\"packs/pack-000001.pack\"",
       "same object"},
      /* two packs of one key */
      {"\"stored\":100}]",
       "\"stored\":100},{\"key\":\"packs/pack-000001.pack\","
       "\"stored\":100}]",
       "same object"},
      /* a packed empty file */
      {"\"size\":5,\"mode\":420,\"mtime_ns\":1",
       "\"size\":0,\"mode\":420,"
       "\"mtime_ns\":1",
       "files[0]"},
      /* a packed file with no frames */
      {"\"frames\":[{\"raw_off\":0,\"raw_len\":5,\"comp_off\":0,"
       "\"comp_len\":14,\"crc32c\":1}]",
       "\"frames\":[]", "files[0].frames"},
  };

  (void)state;
  for (size_t i = 0; i < ARRAY_N(cases); i++) {
    struct spot_manifest *m = NULL;
    char err[256] = "";
    char *s = psubst(cases[i].from, cases[i].to);
    int r = spot_manifest_parse(s, strlen(s), &m, err, sizeof(err));

    if (r != -EBADMSG || strstr(err, cases[i].want) == NULL)
      fail_msg("case %zu: r=%d err='%s' (want '%s')", i, r, err, cases[i].want);
    assert_null(m);
    free(s);
  }
}

static void
test_parse_base(void **state)
{
  struct spot_manifest *m = NULL;
  const struct spot_manifest_file *f;
  char err[256] = "";

  assert_int_equal(
      spot_manifest_parse(base, strlen(base), &m, err, sizeof(err)), 0);
  assert_string_equal(m->name, "step-100");
  assert_string_equal(m->job, "job1");
  assert_int_equal(m->created_ms, CREATED_MS);
  assert_int_equal(m->nfiles, 2);
  assert_int_equal(m->total_raw, 10);
  assert_int_equal(m->total_stored, 35);
  f = spot_manifest_find(m, "a/b.bin");
  assert_non_null(f);
  assert_string_equal(f->key, "a/b.bin.zst");
  assert_int_equal(f->filter, SPOT_FILTER_BYTEGROUP4);
  assert_int_equal(f->mode, 0644);
  assert_int_equal(f->mtime_ns, 123);
  assert_int_equal(f->nframes, 2);
  assert_int_equal(f->stored, 35);
  assert_int_equal(f->frames[0].crc32c, 0xFFFFFFFFu);
  assert_int_equal(f->frames[1].raw_off, 6);
  assert_int_equal(f->frames[1].comp_off, 20);
  f = spot_manifest_find(m, "e");
  assert_non_null(f);
  assert_null(f->key);
  assert_int_equal(f->nframes, 0);
  assert_int_equal(f->mtime_ns, -5);
  assert_null(spot_manifest_find(m, "a"));
  assert_int_equal(spot_manifest_max_frame_raw(m), 6);
  spot_manifest_free(m);
  spot_manifest_free(NULL);
}

/* The optional "epoch" (the writer's lease epoch): absent is 0, present
 * survives a round trip, a bad one is refused naming it. */
static void
test_epoch(void **state)
{
  struct spot_manifest *m = NULL, *m2 = NULL;
  char err[256] = "", *s, *json = NULL;

  assert_int_equal(
      spot_manifest_parse(base, strlen(base), &m, err, sizeof(err)), 0);
  assert_int_equal(m->epoch, 0);
  assert_int_equal(spot_manifest_to_json(m, &json, err, sizeof(err)), 0);
  assert_null(strstr(json, "\"epoch\""));
  free(json);
  m->epoch = 42;
  assert_int_equal(spot_manifest_to_json(m, &json, err, sizeof(err)), 0);
  assert_non_null(strstr(json, "\"epoch\":42"));
  assert_int_equal(
      spot_manifest_parse(json, strlen(json), &m2, err, sizeof(err)), 0);
  assert_int_equal(m2->epoch, 42);
  free(json);
  spot_manifest_free(m2);
  spot_manifest_free(m);
  s = subst("\"totals\"", "\"epoch\":-1,\"totals\"");
  m = NULL;
  assert_int_equal(spot_manifest_parse(s, strlen(s), &m, err, sizeof(err)),
                   -EBADMSG);
  assert_non_null(strstr(err, "epoch"));
  free(s);
  s = subst("\"totals\"", "\"epoch\":\"3\",\"totals\"");
  assert_int_equal(spot_manifest_parse(s, strlen(s), &m, err, sizeof(err)),
                   -EBADMSG);
  free(s);
  (void)state;
}

/* The optional "step" (the trainer's step the checkpoint holds): absent
 * is -1 (unknown) and not written, present survives a round trip, out of
 * 0..2^53 is refused naming it. */
static void
test_step(void **state)
{
  struct spot_manifest *m = NULL, *m2 = NULL;
  char err[256] = "", *s, *json = NULL;

  assert_int_equal(
      spot_manifest_parse(base, strlen(base), &m, err, sizeof(err)), 0);
  assert_true(m->step == -1);
  assert_int_equal(spot_manifest_to_json(m, &json, err, sizeof(err)), 0);
  assert_null(strstr(json, "\"step\""));
  free(json);
  m->step = 94;
  assert_int_equal(spot_manifest_to_json(m, &json, err, sizeof(err)), 0);
  assert_non_null(strstr(json, "\"step\":94"));
  assert_int_equal(
      spot_manifest_parse(json, strlen(json), &m2, err, sizeof(err)), 0);
  assert_true(m2->step == 94);
  free(json);
  spot_manifest_free(m2);
  spot_manifest_free(m);
  m = NULL;
  s = subst("\"totals\"", "\"step\":-1,\"totals\"");
  assert_int_equal(spot_manifest_parse(s, strlen(s), &m, err, sizeof(err)),
                   -EBADMSG);
  assert_non_null(strstr(err, "step"));
  free(s);
  s = subst("\"totals\"", "\"step\":9007199254740993,\"totals\"");
  assert_int_equal(spot_manifest_parse(s, strlen(s), &m, err, sizeof(err)),
                   -EBADMSG);
  free(s);
  assert_int_equal(spot_manifest_new("checkpoint-94", "j", CREATED_MS, &m), 0);
  assert_true(m->step == -1);
  spot_manifest_free(m);
  (void)state;
}

static void
test_build_roundtrip(void **state)
{
  struct spot_manifest *m, *p;
  size_t big, small, empty;
  char *json, *json2, err[256] = "";

  assert_int_equal(spot_manifest_new("ckpt-7", "job-x", CREATED_MS, &m), 0);
  assert_int_equal(spot_manifest_add_file(m, "model/weights.bin",
                                          "model/weights.bin.zst",
                                          (8u << 20) * 2 + 5, 0644, 42,
                                          SPOT_FILTER_BYTEGROUP4, &big),
                   0);
  assert_int_equal(spot_manifest_add_file(m, "empty", NULL, 0, 0600, 0,
                                          SPOT_FILTER_NONE, &empty),
                   0);
  assert_int_equal(spot_manifest_add_file(m, "nested/dir/t.txt",
                                          "nested/dir/t.txt.zst", 3, 0755, -1,
                                          SPOT_FILTER_NONE, &small),
                   0);
  /* parts finish out of order */
  assert_int_equal(spot_manifest_set_frame(m, big, 2, 5, 14, 3), 0);
  assert_int_equal(spot_manifest_set_frame(m, small, 0, 3, 12, 99), 0);
  /* frame 1 missing: refused with a message */
  assert_int_equal(spot_manifest_set_frame(m, big, 0, 8u << 20, 7000000, 1), 0);
  assert_int_equal(spot_manifest_to_json(m, &json, err, sizeof(err)), -EINVAL);
  assert_non_null(strstr(err, "files[0].frames[1]: missing"));
  assert_int_equal(spot_manifest_set_frame(m, big, 1, 8u << 20, 6900000, 2), 0);
  assert_int_equal(spot_manifest_to_json(m, &json, err, sizeof(err)), 0);
  assert_int_equal(m->total_raw, (8u << 20) * 2 + 5 + 3);
  assert_int_equal(m->total_stored, 7000000 + 6900000 + 14 + 12);
  assert_int_equal(m->files[big].frames[2].raw_off, 16u << 20);
  assert_int_equal(m->files[big].frames[2].comp_off, 13900000);
  assert_non_null(strstr(json, "\"created\":\"2026-12-02T10:13:50Z\""));
  assert_non_null(strstr(json, "\"filter\":\"bytegroup4\""));

  assert_int_equal(
      spot_manifest_parse(json, strlen(json), &p, err, sizeof(err)), 0);
  assert_int_equal(p->nfiles, 3);
  assert_string_equal(p->files[2].path, "nested/dir/t.txt");
  assert_int_equal(p->files[2].mode, 0755);
  assert_int_equal(p->files[2].mtime_ns, -1);
  assert_int_equal(p->files[0].frames[1].crc32c, 2);
  assert_int_equal(p->files[0].frames[1].comp_off, 7000000);
  assert_int_equal(spot_manifest_max_frame_raw(p), 8u << 20);
  /* parse -> serialize is the identity */
  assert_int_equal(spot_manifest_to_json(p, &json2, err, sizeof(err)), 0);
  assert_string_equal(json, json2);
  free(json);
  free(json2);
  spot_manifest_free(p);
  spot_manifest_free(m);
}

static void
test_builder_rejects(void **state)
{
  struct spot_manifest *m;
  size_t i;
  char *json = NULL, err[256];

  assert_int_equal(spot_manifest_new("a/b", "job", 0, &m), -EINVAL);
  assert_int_equal(spot_manifest_new("ok", "", 0, &m), -EINVAL);
  assert_int_equal(spot_manifest_new("ok", "job", -1, &m), -EINVAL);
  assert_int_equal(spot_manifest_new("ok", "job", INT64_MAX, &m), -EINVAL);
  assert_int_equal(spot_manifest_new("ok", "job", 0, &m), 0);
  assert_int_equal(spot_manifest_add_file(m, "../x", "x.zst", 1, 0644, 0,
                                          SPOT_FILTER_NONE, NULL),
                   -EINVAL);
  assert_int_equal(
      spot_manifest_add_file(m, "x", NULL, 1, 0644, 0, SPOT_FILTER_NONE, NULL),
      -EINVAL);
  assert_int_equal(spot_manifest_add_file(m, "x", "x.zst", 0, 0644, 0,
                                          SPOT_FILTER_NONE, NULL),
                   -EINVAL);
  assert_int_equal(spot_manifest_add_file(m, "x", "x.zst", 1, 0100644, 0,
                                          SPOT_FILTER_NONE, NULL),
                   -EINVAL);
  assert_int_equal(spot_manifest_add_file(m, "x", "x.zst", 1, 0644, 0,
                                          SPOT_FILTER_LAST, NULL),
                   -EINVAL);
  assert_int_equal(spot_manifest_add_file(m, "x", "MANIFEST.json", 1, 0644, 0,
                                          SPOT_FILTER_NONE, NULL),
                   -EINVAL);
  assert_int_equal(spot_manifest_add_file(m, "bad\xff", "x.zst", 1, 0644, 0,
                                          SPOT_FILTER_NONE, NULL),
                   -EINVAL);
  assert_int_equal(spot_manifest_add_file(m, "x", "x.zst", 10, 0644, 0,
                                          SPOT_FILTER_NONE, &i),
                   0);
  assert_int_equal(spot_manifest_set_frame(m, 5, 0, 10, 10, 0), -EINVAL);
  assert_int_equal(spot_manifest_set_frame(m, i, 0, 0, 10, 0), -EINVAL);
  assert_int_equal(spot_manifest_set_frame(m, i, 0, 10, 0, 0), -EINVAL);
  assert_int_equal(spot_manifest_set_frame(m, i, 0, 10, 1000000, 0), -EINVAL);
  assert_int_equal(
      spot_manifest_set_frame(m, i, 0, SPOT_CODEC_PART_MAX + 1, 10, 0),
      -EINVAL);
  assert_int_equal(
      spot_manifest_set_frame(m, i, SPOT_MANIFEST_FRAMES_MAX, 10, 10, 0),
      -E2BIG);
  /* frames that do not add up to the size */
  assert_int_equal(spot_manifest_set_frame(m, i, 0, 9, 10, 0), 0);
  assert_int_equal(spot_manifest_to_json(m, &json, err, sizeof(err)), -EINVAL);
  assert_non_null(strstr(err, "files[0].frames: cover 9 bytes, size is 10"));
  assert_int_equal(spot_manifest_set_frame(m, i, 0, 10, 10, 0), 0);
  /* a duplicate path, then a file inside a file */
  assert_int_equal(
      spot_manifest_add_file(m, "x", "y.zst", 1, 0644, 0, SPOT_FILTER_NONE, &i),
      0);
  assert_int_equal(spot_manifest_set_frame(m, i, 0, 1, 10, 0), 0);
  assert_int_equal(spot_manifest_to_json(m, &json, err, sizeof(err)), -EINVAL);
  assert_string_equal(err, "files[1].path: duplicate");
  free(m->files[1].path);
  m->files[1].path = strdup("x/y");
  assert_int_equal(spot_manifest_to_json(m, &json, err, sizeof(err)), -EINVAL);
  assert_non_null(strstr(err, "files[1].path: inside another file's path"));
  free(m->files[1].path);
  m->files[1].path = strdup("z");
  assert_int_equal(spot_manifest_to_json(m, &json, NULL, 0), 0);
  free(json);
  spot_manifest_free(m);
}

struct reject {
  const char *from, *to; /* edit of base */
  int code;
  const char *msg; /* substring of the error */
};

static const struct reject rejects[] = {
    {"\"a/b.bin\"", "\"a/../b.bin\"", -EBADMSG,
     "files[0].path: '..' component"},
    {"\"a/b.bin\"", "\"..\"", -EBADMSG, "files[0].path: '..' component"},
    {"\"a/b.bin\"", "\"/etc/passwd\"", -EBADMSG, "files[0].path: absolute"},
    {"\"a/b.bin\"", "\"a//b.bin\"", -EBADMSG, "files[0].path: empty component"},
    {"\"a/b.bin\"", "\"a/b.bin/\"", -EBADMSG, "files[0].path: empty component"},
    {"\"a/b.bin\"", "\"./b.bin\"", -EBADMSG, "files[0].path: '.' component"},
    {"\"a/b.bin\"", "\"\"", -EBADMSG, "files[0].path: empty"},
    {"\"a/b.bin\"", "\"a\\u0000b\"", -EBADMSG, "invalid JSON"},
    {"\"a/b.bin\"", "5", -EBADMSG, "files[0].path: not a string"},
    {"\"path\":\"e\"", "\"path\":\"a/b.bin\"", -EBADMSG,
     "files[1].path: duplicate"},
    {"\"path\":\"e\"", "\"path\":\"a/b.bin/c\"", -EBADMSG,
     "files[1].path: inside another file's path (a/b.bin)"},
    {"\"key\":\"a/b.bin.zst\"", "\"key\":\"../x.zst\"", -EBADMSG,
     "files[0].key: '..' component"},
    {"\"key\":\"a/b.bin.zst\"", "\"key\":\"MANIFEST.json\"", -EBADMSG,
     "files[0].key: reserved"},
    {"\"key\":\"a/b.bin.zst\",", "", -EBADMSG, "files[0].key: missing"},
    {"\"mtime_ns\":-5,", "\"mtime_ns\":-5,\"key\":\"e.zst\",", -EBADMSG,
     "files[1]: an empty file has no key"},
    {"\"raw_off\":6", "\"raw_off\":5", -EBADMSG,
     "files[0].frames[1].raw_off: 5, expected 6"},
    {"\"comp_off\":20", "\"comp_off\":21", -EBADMSG,
     "files[0].frames[1].comp_off: 21, expected 20"},
    {"\"raw_off\":0,", "\"raw_off\":1,", -EBADMSG,
     "files[0].frames[0].raw_off: 1, expected 0"},
    {"\"size\":10", "\"size\":11", -EBADMSG,
     "files[0].frames: cover 10 bytes, size is 11"},
    {"\"raw_len\":4", "\"raw_len\":0", -EBADMSG,
     "files[0].frames[1].raw_len: 0 not in"},
    {"\"raw_len\":4", "\"raw_len\":134217729", -EBADMSG,
     "files[0].frames[1].raw_len: 134217729 not in"},
    {"\"comp_len\":15", "\"comp_len\":100000", -EBADMSG,
     "files[0].frames[1].comp_len: 100000 not in"},
    {"\"version\":1", "\"version\":3", -EPROTONOSUPPORT,
     "version: 3 not supported"},
    {"\"crc32c\":7", "\"crc32c\":7,\"ref\":0", -EBADMSG,
     "files[0].frames[1].ref: needs version 2"},
    {"\"crc32c\":7", "\"crc32c\":7,\"sha256\":\"00\"", -EBADMSG,
     "files[0].frames[1].sha256: needs version 2"},
    {"\"version\":1", "\"version\":\"1\"", -EBADMSG, "version: not an integer"},
    {"\"version\":1,", "", -EBADMSG, "version: missing"},
    {"\"format\":\"spotd-checkpoint\"", "\"format\":\"other\"", -EBADMSG,
     "format: not"},
    {"\"size\":10", "\"size\":99999999999999999999", -EBADMSG,
     "invalid JSON: too big integer"},
    {"\"size\":10", "\"size\":1e30", -EBADMSG, "files[0].size: not an integer"},
    {"\"size\":10", "\"size\":10.0", -EBADMSG, "files[0].size: not an integer"},
    {"\"size\":10", "\"size\":-10", -EBADMSG, "files[0].size: -10 not in"},
    {"\"crc32c\":7", "\"crc32c\":4294967296", -EBADMSG,
     "files[0].frames[1].crc32c: 4294967296 not in"},
    {"\"mode\":420", "\"mode\":4096", -EBADMSG, "files[0].mode: 4096 not in"},
    {"\"mode\":420,", "", -EBADMSG, "files[0].mode: missing"},
    {"\"filter\":\"bytegroup4\"", "\"filter\":\"lz4\"", -EBADMSG,
     "files[0].filter: unknown 'lz4'"},
    {"\"filter\":\"bytegroup4\"", "\"filter\":\"\\u001b[31m\"", -EBADMSG,
     "files[0].filter: unknown '?[31m'"},
    {"\"filter\":\"bytegroup4\"", "\"filter\":null", -EBADMSG,
     "files[0].filter: not a string"},
    {"\"files\":[", "\"files\":{\"x\":[", -EBADMSG, "invalid JSON"},
    {"\"frames\":[]", "\"frames\":{}", -EBADMSG,
     "files[1].frames: not an array"},
    {"\"frames\":[{", "\"frames\":[7,{", -EBADMSG,
     "files[0].frames[0]: not an object"},
    {"\"totals\":{\"files\":2,", "\"totals\":{\"files\":3,", -EBADMSG,
     "totals.files: 3, the manifest lists 2"},
    {"\"raw_bytes\":10", "\"raw_bytes\":11", -EBADMSG, "totals.raw_bytes: 11"},
    {"\"stored_bytes\":35", "\"stored_bytes\":36", -EBADMSG,
     "totals.stored_bytes: 36"},
    {"\"totals\":{", "\"totals\":{\"extra\":1,", -EBADMSG,
     "totals.extra: unknown key"},
    {"\"mtime_ns\":123", "\"mtime_ns\":123,\"owner\":0", -EBADMSG,
     "files[0].owner: unknown key"},
    {"\"crc32c\":7", "\"crc32c\":7,\"x\":1", -EBADMSG,
     "files[0].frames[1].x: unknown key"},
    {"\"job\":\"job1\"", "\"job\":\"job1\",\"job\":\"job2\"", -EBADMSG,
     "invalid JSON: duplicate object key"},
    {"\"name\":\"step-100\"", "\"name\":\"a/b\"", -EBADMSG,
     "name: not a valid checkpoint name"},
    {"\"name\":\"step-100\"", "\"name\":\"..\"", -EBADMSG, "name: not a valid"},
    /* names that would collide with spotd's own folders */
    {"\"name\":\"step-100\"", "\"name\":\".spotd-resume\"", -EBADMSG,
     "name: not a valid"},
    {"\"name\":\"step-100\"", "\"name\":\".spotd-journal\"", -EBADMSG,
     "name: not a valid"},
    {"\"name\":\"step-100\"", "\"name\":\".x\"", -EBADMSG, "name: not a valid"},
    /* symlinks that leave the checkpoint, or carry data (13.5) */
    {"\"mtime_ns\":-5,", "\"mtime_ns\":-5,\"link\":\"../x\",", -EBADMSG,
     "files[1].link: not a relative link inside the checkpoint"},
    {"\"mtime_ns\":-5,", "\"mtime_ns\":-5,\"link\":\"/etc\",", -EBADMSG,
     "files[1].link: not a relative link inside"},
    {"\"mtime_ns\":123,", "\"mtime_ns\":123,\"link\":\"e\",", -EBADMSG,
     "files[0].link: a symlink has size 0"},
    {"\"mtime_ns\":-5,", "\"mtime_ns\":-5,\"link\":5,", -EBADMSG,
     "files[1].link: not a string"},
    /* what the restore could not do, refused before any data (14.10) */
    {"\"mtime_ns\":123", "\"mtime_ns\":-9223372036854775808", -EBADMSG,
     "files[0].mtime_ns: -9223372036854775808 not in"},
    {"\"mtime_ns\":123", "\"mtime_ns\":-2147483648000000001", -EBADMSG,
     "files[0].mtime_ns: -2147483648000000001 not in"},
    {"\"job\":\"job1\"", "\"job\":\"\"", -EBADMSG, "job: not a valid job id"},
    {"\"created\":\"2026-12-02T10:13:50Z\"", "\"created\":\"yesterday\"",
     -EBADMSG, "created: not an RFC 3339 time"},
    {"\"created\":\"2026-12-02T10:13:50Z\"",
     "\"created\":\"1969-12-31T23:59:59Z\"", -EBADMSG,
     "created: not an RFC 3339 time"},
};

static void
test_parse_rejects(void **state)
{
  for (size_t i = 0; i < ARRAY_N(rejects); i++) {
    char *s = subst(rejects[i].from, rejects[i].to), err[256] = "";
    struct spot_manifest *m = (void *)1;
    int r = spot_manifest_parse(s, strlen(s), &m, err, sizeof(err));

    if (r != rejects[i].code || !strstr(err, rejects[i].msg))
      fail_msg("case %zu (%s -> %s): got %d '%s', want %d '%s'", i,
               rejects[i].from, rejects[i].to, r, err, rejects[i].code,
               rejects[i].msg);
    if (getenv("SHOW_ERRORS"))
      printf("# %s\n", err);
    assert_ptr_equal(m, (void *)1); /* untouched on failure */
    free(s);
  }
}

static void
test_parse_shapes(void **state)
{
  static const char *const bad[] = {"",
                                    "[]",
                                    "null",
                                    "{",
                                    "{}",
                                    "\"x\"",
                                    "{\"format\":\"spotd-checkpoint\"}",
                                    "{\"format\":1}",
                                    "\xff\xfe"};
  struct spot_manifest *m;
  char err[256], *big;

  for (size_t i = 0; i < ARRAY_N(bad); i++) {
    err[0] = '\0';
    assert_int_equal(
        spot_manifest_parse(bad[i], strlen(bad[i]), &m, err, sizeof(err)),
        -EBADMSG);
    assert_true(err[0] != '\0');
  }
  /* a path at the length limit is fine, one byte more is not */
  big = malloc(2 * SPOT_MANIFEST_PATH_MAX);
  assert_non_null(big);
  for (size_t n = SPOT_MANIFEST_PATH_MAX; n <= SPOT_MANIFEST_PATH_MAX + 1;
       n++) {
    char path[SPOT_MANIFEST_PATH_MAX + 4], *s;

    for (size_t k = 0; k < n; k++)
      path[k] = (k % 200 == 199) ? '/' : 'p';
    path[0] = 'q';
    path[n] = '\0';
    snprintf(big, 2 * SPOT_MANIFEST_PATH_MAX, "\"%s\"", path);
    s = subst("\"e\"", big);
    err[0] = '\0';
    if (n == SPOT_MANIFEST_PATH_MAX) {
      assert_int_equal(spot_manifest_parse(s, strlen(s), &m, err, sizeof(err)),
                       0);
      spot_manifest_free(m);
    } else {
      assert_int_equal(spot_manifest_parse(s, strlen(s), &m, err, sizeof(err)),
                       -EBADMSG);
      assert_non_null(strstr(err, "files[1].path: longer than 4095"));
    }
    free(s);
  }
  /* a 256-byte component */
  memset(big, 'c', 256);
  big[0] = '"';
  big[257] = '"';
  big[258] = '\0';
  {
    char *s = subst("\"e\"", big);

    assert_int_equal(spot_manifest_parse(s, strlen(s), &m, err, sizeof(err)),
                     -EBADMSG);
    assert_non_null(strstr(err, "component longer than 255"));
    free(s);
  }
  free(big);
  assert_int_equal(spot_manifest_parse("{}", SPOT_MANIFEST_JSON_MAX + 1, &m,
                                       err, sizeof(err)),
                   -E2BIG);
}

/* Issue 13.5: which symlink targets stay inside the checkpoint. */
static void
test_links(void **state)
{
  struct spot_manifest *m = NULL, *back = NULL;
  char *json = NULL, err[256];
  size_t idx;

  (void)state;
  assert_true(spot_manifest_link_valid("a", "b"));
  assert_true(spot_manifest_link_valid("a", "sub/data.bin"));
  assert_true(spot_manifest_link_valid("sub/x", ".."));
  assert_true(spot_manifest_link_valid("sub/x", "../alias"));
  assert_true(spot_manifest_link_valid("s/t/x", "../../a/b"));
  assert_false(spot_manifest_link_valid("a", "/etc/passwd"));
  assert_false(spot_manifest_link_valid("a", ".."));
  assert_false(spot_manifest_link_valid("a", "../outside"));
  assert_false(spot_manifest_link_valid("sub/x", "../../outside"));
  assert_false(spot_manifest_link_valid("a", "sub/../../x")); /* after a name */
  assert_false(spot_manifest_link_valid("a", "b/.."));
  assert_false(spot_manifest_link_valid("a", "."));
  assert_false(spot_manifest_link_valid("a", "./b"));
  assert_false(spot_manifest_link_valid("a", "b//c"));
  assert_false(spot_manifest_link_valid("a", "b/"));
  assert_false(spot_manifest_link_valid("a", ""));
  assert_false(spot_manifest_link_valid("../a", "b"));
  assert_false(spot_manifest_link_valid("a", NULL));

  /* build, serialize, parse back */
  assert_int_equal(spot_manifest_new("ck", "job", 1000, &m), 0);
  assert_int_equal(spot_manifest_add_link(m, "alias", "sub/f", 5, &idx), 0);
  assert_int_equal(spot_manifest_add_link(m, "bad", "../x", 5, NULL), -EINVAL);
  assert_int_equal(spot_manifest_to_json(m, &json, err, sizeof(err)), 0);
  assert_non_null(strstr(json, "\"link\":\"sub/f\""));
  assert_int_equal(
      spot_manifest_parse(json, strlen(json), &back, err, sizeof(err)), 0);
  assert_string_equal(back->files[0].link, "sub/f");
  assert_int_equal(back->files[0].size, 0);
  assert_null(back->files[0].key);
  spot_manifest_free(back);
  spot_manifest_free(m);
  free(json);
}

/* Issue 14.6: the file limit holds when building and parsing, and a
 * "files" array over it is refused without parsing its elements. */
static void
test_limits(void **state)
{
  struct spot_manifest *m = NULL;
  size_t n = SPOT_MANIFEST_FILES_MAX + 1, len;
  char *json, *p, err[256];

  (void)state;
  assert_int_equal(spot_manifest_new("ck", "job", 1000, &m), 0);
  for (size_t i = 0; i < SPOT_MANIFEST_FILES_MAX; i++) {
    char path[32];

    snprintf(path, sizeof(path), "d%zu/f%zu", i / 1000, i);
    assert_int_equal(spot_manifest_add_file(m, path, NULL, 0, 0644, 0,
                                            SPOT_FILTER_NONE, NULL),
                     0);
  }
  assert_int_equal(spot_manifest_add_file(m, "one-more", NULL, 0, 0644, 0,
                                          SPOT_FILTER_NONE, NULL),
                   -E2BIG);
  assert_int_equal(spot_manifest_to_json(m, &json, err, sizeof(err)), 0);
  assert_true(strlen(json) <= SPOT_MANIFEST_JSON_MAX);
  free(json);
  spot_manifest_free(m);

  /* one element too many: "1" each, refused before any element parse */
  len = 300 + 2 * n;
  json = malloc(len);
  assert_non_null(json);
  p = json + snprintf(json, len,
                      "{\"format\":\"spotd-checkpoint\",\"version\":1,"
                      "\"name\":\"ck\",\"job\":\"job\",\"created\":"
                      "\"2026-12-02T10:13:50Z\",\"totals\":{\"files\":0,"
                      "\"raw_bytes\":0,\"stored_bytes\":0},\"files\":[");
  for (size_t i = 0; i < n; i++) {
    *p++ = '1';
    *p++ = i + 1 < n ? ',' : ']';
  }
  *p++ = '}';
  m = NULL;
  err[0] = '\0';
  assert_int_equal(
      spot_manifest_parse(json, (size_t)(p - json), &m, err, sizeof(err)),
      -EBADMSG);
  assert_non_null(strstr(err, "files: more than 300000"));
  assert_null(m);
  free(json);
}

static void
test_names(void **state)
{
  char long_name[SPOT_CKPT_NAME_MAX + 2];

  assert_true(spot_ckpt_name_valid("step-100"));
  assert_true(spot_ckpt_name_valid("2026-12-02T10:13:50Z_v1.2"));
  assert_false(spot_ckpt_name_valid(NULL));
  assert_false(spot_ckpt_name_valid(""));
  assert_false(spot_ckpt_name_valid("."));
  assert_false(spot_ckpt_name_valid(".."));
  assert_false(spot_ckpt_name_valid("a..b"));
  assert_false(spot_ckpt_name_valid("a/b"));
  assert_false(spot_ckpt_name_valid("a\\b"));
  assert_false(spot_ckpt_name_valid("a b"));
  assert_false(spot_ckpt_name_valid("a\nb"));
  assert_false(spot_ckpt_name_valid("\x7f"));
  assert_false(spot_ckpt_name_valid("caf\xc3\xa9"));
  assert_false(spot_ckpt_name_valid(".spotd-resume"));
  assert_false(spot_ckpt_name_valid(".spotd-journal"));
  assert_false(spot_ckpt_name_valid(".hidden"));
  assert_true(spot_ckpt_name_valid("v1.2"));
  memset(long_name, 'n', sizeof(long_name));
  long_name[SPOT_CKPT_NAME_MAX] = '\0';
  assert_true(spot_ckpt_name_valid(long_name));
  long_name[SPOT_CKPT_NAME_MAX] = 'n';
  long_name[SPOT_CKPT_NAME_MAX + 1] = '\0';
  assert_false(spot_ckpt_name_valid(long_name));

  assert_true(spot_manifest_path_valid("a/b/c.pt"));
  assert_true(spot_manifest_path_valid("..a/b..")); /* not a '..' component */
  assert_true(spot_manifest_path_valid("caf\xc3\xa9"));
  assert_false(spot_manifest_path_valid("caf\xc3"));
  assert_false(spot_manifest_path_valid("\xed\xa0\x80")); /* surrogate */
  assert_false(spot_manifest_path_valid("\xc0\xaf"));     /* overlong '/' */
  assert_false(spot_manifest_path_valid("a/./b"));
  assert_false(spot_manifest_path_valid(NULL));
}

static void
test_name_step(void **state)
{
  (void)state;
  assert_true(spot_ckpt_name_step("step-000042") == 42);
  assert_true(spot_ckpt_name_step("global_step1200") == 1200);
  assert_true(spot_ckpt_name_step("ckpt_step=5") == 5);
  assert_true(spot_ckpt_name_step("STEP.7-final") == 7);
  assert_true(spot_ckpt_name_step("epoch3-step-100") == 100);
  assert_true(spot_ckpt_name_step("1200") == 1200);
  assert_true(spot_ckpt_name_step("step-0") == 0);
  /* no stated step */
  assert_true(spot_ckpt_name_step("final") == -1);
  assert_true(spot_ckpt_name_step("ckpt-2025") == -1);
  assert_true(spot_ckpt_name_step("step-12b") == -1);
  assert_true(spot_ckpt_name_step("step-") == -1);
  assert_true(spot_ckpt_name_step("step-99999999999999999999") == -1);
  assert_true(spot_ckpt_name_step("step-9007199254740993") == -1);
  assert_true(spot_ckpt_name_step("step-9007199254740992") ==
              ((int64_t)1 << 53));
  assert_true(spot_ckpt_name_step("") == -1);
  assert_true(spot_ckpt_name_step(NULL) == -1);
  assert_true(spot_ckpt_name_step("../step-1") == -1);
}

/* The marker file: empty is an unknown step (older trainers), "step=N"
 * states it, other keys are skipped, anything malformed is refused with
 * one line and leaves the output alone. */
static void
test_marker(void **state)
{
  char err[200];
  int64_t step;
  char big[SPOT_MARKER_MAX + 2];
  static const char *const bad[] = {
      "step=",
      "step=-1",
      "step=12b",
      "step=0x10",
      "step=9007199254740993",
      "step=99999999999999999999",
      "step=1\nstep=2",
      "garbage",
      "step 5",
  };

  (void)state;
  step = 7;
  assert_int_equal(spot_marker_parse("", 0, &step, err, sizeof(err)), 0);
  assert_true(step == -1);
  assert_int_equal(spot_marker_parse(NULL, 0, &step, err, sizeof(err)), 0);
  assert_true(step == -1);
  assert_int_equal(spot_marker_parse("step=48\n", 8, &step, err, sizeof(err)),
                   0);
  assert_true(step == 48);
  assert_int_equal(
      spot_marker_parse("# spotd\r\n  step = 94 \r\nname=checkpoint-94\n\n",
                        strlen("# spotd\r\n  step = 94 \r\nname=checkpoint-94"
                               "\n\n"),
                        &step, err, sizeof(err)),
      0);
  assert_true(step == 94);
  assert_int_equal(
      spot_marker_parse("framework=hf\n", 13, &step, err, sizeof(err)), 0);
  assert_true(step == -1);
  assert_int_equal(
      spot_marker_parse("step=9007199254740992", 21, &step, err, sizeof(err)),
      0);
  assert_true(step == ((int64_t)1 << 53));
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    step = 3;
    err[0] = '\0';
    assert_int_equal(
        spot_marker_parse(bad[i], strlen(bad[i]), &step, err, sizeof(err)),
        -EINVAL);
    assert_true(step == 3);
    assert_true(err[0] != '\0');
  }
  assert_int_equal(spot_marker_parse("step=1\0", 7, &step, err, sizeof(err)),
                   -EINVAL);
  memset(big, '#', sizeof(big));
  big[0] = '\n';
  assert_int_equal(
      spot_marker_parse(big, SPOT_MARKER_MAX + 1, &step, err, sizeof(err)),
      -EINVAL);
  assert_int_equal(
      spot_marker_parse(big, SPOT_MARKER_MAX, &step, err, sizeof(err)), 0);
}

/* A valid manifest with references (version 2): m.pt's first frame is in
 * an earlier checkpoint's object, its second in its own; "all" is all
 * references and has no key. */
#define SHA_A "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
static const char refd[] =
    "{\"format\":\"spotd-checkpoint\",\"version\":2,\"name\":\"step-100\","
    "\"job\":\"job1\",\"created\":\"2026-12-02T10:13:50Z\","
    "\"totals\":{\"files\":2,\"raw_bytes\":13,\"stored_bytes\":15,"
    "\"ref_bytes\":9},"
    "\"refs\":[{\"name\":\"step-50\","
    "\"key\":\"attempt-0123456789abcdef/m.pt.zst\",\"stored\":200}],"
    "\"files\":["
    "{\"path\":\"m.pt\",\"size\":10,\"mode\":420,\"mtime_ns\":1,"
    "\"filter\":\"none\",\"key\":\"attempt-00000000000000aa/m.pt.zst\","
    "\"frames\":["
    "{\"raw_off\":0,\"raw_len\":6,\"ref\":0,\"comp_off\":100,\"comp_len\":20,"
    "\"crc32c\":5,\"sha256\":\"" SHA_A "\"},"
    "{\"raw_off\":6,\"raw_len\":4,\"comp_off\":0,\"comp_len\":15,"
    "\"crc32c\":7,\"sha256\":\"" SHA_A "\"}]},"
    "{\"path\":\"all\",\"size\":3,\"mode\":420,\"mtime_ns\":2,"
    "\"filter\":\"none\",\"frames\":["
    "{\"raw_off\":0,\"raw_len\":3,\"ref\":0,\"comp_off\":0,\"comp_len\":12,"
    "\"crc32c\":6}]}]}";

static char *
rsubst(const char *from, const char *to)
{
  const char *p = strstr(refd, from);
  size_t n = strlen(refd) - strlen(from) + strlen(to) + 1;
  char *s = malloc(n);

  assert_non_null(p);
  assert_non_null(s);
  snprintf(s, n, "%.*s%s%s", (int)(p - refd), refd, to, p + strlen(from));
  return s;
}

static void
test_refs(void **state)
{
  struct spot_manifest *m = NULL, *b = NULL;
  const struct spot_manifest_file *f;
  const char *name;
  char err[256] = "", *json = NULL;
  unsigned char sha[SPOT_MANIFEST_SHA256_LEN];
  size_t i, ref;

  (void)state;
  assert_int_equal(
      spot_manifest_parse(refd, strlen(refd), &m, err, sizeof(err)), 0);
  assert_int_equal(m->nrefs, 1);
  assert_int_equal(m->total_ref_raw, 9);
  assert_int_equal(m->total_stored, 15);
  f = spot_manifest_find(m, "m.pt");
  assert_int_equal(f->stored, 15);
  assert_int_equal(f->frames[0].ref, 1);
  assert_true(f->frames[0].has_sha);
  assert_int_equal(f->frames[0].sha256[0], 0x9f);
  assert_string_equal(spot_manifest_frame_key(m, f, &f->frames[0], &name),
                      "attempt-0123456789abcdef/m.pt.zst");
  assert_string_equal(name, "step-50");
  assert_string_equal(spot_manifest_frame_key(m, f, &f->frames[1], &name),
                      "attempt-00000000000000aa/m.pt.zst");
  assert_null(name);
  f = spot_manifest_find(m, "all");
  assert_null(f->key);
  assert_int_equal(f->stored, 0);
  /* written back the same */
  assert_int_equal(spot_manifest_to_json(m, &json, err, sizeof(err)), 0);
  assert_string_equal(json, refd);
  free(json);

  /* built the same */
  assert_int_equal(spot_manifest_new("step-100", "job1", CREATED_MS, &b), 0);
  assert_int_equal(spot_manifest_add_ref(b, "step-100", "x", 1, &ref),
                   -EINVAL); /* itself */
  assert_int_equal(spot_manifest_add_ref(b, "step-50",
                                         "attempt-0123456789abcdef/m.pt.zst",
                                         200, &ref),
                   0);
  assert_int_equal(spot_manifest_add_ref(b, "step-50",
                                         "attempt-0123456789abcdef/m.pt.zst",
                                         200, &ref),
                   0);
  assert_int_equal(b->nrefs, 1);
  assert_int_equal(spot_manifest_add_file(b, "m.pt",
                                          "attempt-00000000000000aa/m.pt.zst",
                                          10, 0644, 1, SPOT_FILTER_NONE, &i),
                   0);
  memcpy(sha, m->files[0].frames[0].sha256, sizeof(sha));
  assert_int_equal(spot_manifest_set_frame(b, i, 1, 4, 15, 7), 0);
  assert_int_equal(spot_manifest_set_frame_sha(b, i, 1, sha), 0);
  assert_int_equal(
      spot_manifest_set_ref_frame(b, i, 0, ref, 100, 6, 20, 5, sha), 0);
  assert_int_equal(spot_manifest_add_file(b, "all", "all.zst", 3, 0644, 2,
                                          SPOT_FILTER_NONE, &i),
                   0);
  assert_int_equal(spot_manifest_set_ref_frame(b, i, 0, ref, 0, 3, 12, 6, NULL),
                   0);
  /* every frame a reference: no object, no key */
  assert_int_equal(spot_manifest_to_json(b, &json, err, sizeof(err)), -EINVAL);
  assert_non_null(strstr(err, "files[1].key: every frame is a reference"));
  assert_int_equal(spot_manifest_clear_key(b, i), 0);
  assert_int_equal(spot_manifest_to_json(b, &json, err, sizeof(err)), 0);
  assert_string_equal(json, refd);
  free(json);
  spot_manifest_free(b);
  spot_manifest_free(m);
}

static const struct reject ref_rejects[] = {
    {"\"ref\":0,\"comp_off\":100", "\"ref\":1,\"comp_off\":100", -EBADMSG,
     "files[0].frames[0].ref: not in refs"},
    {"\"ref\":0,\"comp_off\":100", "\"ref\":-1,\"comp_off\":100", -EBADMSG,
     "files[0].frames[0].ref: -1 not in"},
    {"\"comp_off\":100", "\"comp_off\":190", -EBADMSG,
     "files[0].frames[0].comp_off: 190+20 past refs[0]'s 200 bytes"},
    {"\"comp_off\":100", "\"comp_off\":9223372036854775807", -EBADMSG,
     "past refs[0]"},
    {"\"name\":\"step-50\"", "\"name\":\"step-100\"", -EBADMSG,
     "refs[0].name: not another checkpoint's name"},
    {"\"name\":\"step-50\"", "\"name\":\"../x\"", -EBADMSG,
     "refs[0].name: not a valid checkpoint name"},
    {"\"key\":\"attempt-0123456789abcdef/m.pt.zst\"", "\"key\":\"../m\"",
     -EBADMSG, "refs[0].key: '..' component"},
    {"\"key\":\"attempt-0123456789abcdef/m.pt.zst\"",
     "\"key\":\"MANIFEST.json\"", -EBADMSG, "refs[0].key: reserved"},
    {"\"stored\":200", "\"stored\":0", -EBADMSG, "refs[0].stored: 0 not in"},
    {"\"stored\":200}", "\"stored\":200,\"x\":1}", -EBADMSG,
     "refs[0].x: unknown key"},
    {"\"refs\":[", "\"refs\":{\"a\":[", -EBADMSG, "invalid JSON"},
    {"\"ref_bytes\":9", "\"ref_bytes\":8", -EBADMSG,
     "totals.ref_bytes: 8, the references add up to 9"},
    {"\"sha256\":\"9f", "\"sha256\":\"9F", -EBADMSG,
     "files[0].frames[0].sha256: not 64 lower-case hex digits"},
    {"\"sha256\":\"9f", "\"sha256\":\"9", -EBADMSG,
     "files[0].frames[0].sha256: not 64"},
    {"\"sha256\":\"9f", "\"sha256\":5,\"x\":\"9f", -EBADMSG, "unknown key"},
    {"\"filter\":\"none\",\"frames\":[{\"raw_off\":0,\"raw_len\":3,\"ref\":0",
     "\"filter\":\"none\",\"frames\":[{\"raw_off\":0,\"raw_len\":3", -EBADMSG,
     "files[1].key: missing"},
    {"\"key\":\"attempt-00000000000000aa/m.pt.zst\",",
     "\"key\":\"attempt-00000000000000aa/m.pt.zst\",\"pack\":\"p\",", -EBADMSG,
     "files[0].pack: not in packs"},
};

static void
test_refs_reject(void **state)
{
  (void)state;
  for (size_t i = 0; i < ARRAY_N(ref_rejects); i++) {
    char *s = rsubst(ref_rejects[i].from, ref_rejects[i].to), err[256] = "";
    struct spot_manifest *m = (void *)1;
    int r = spot_manifest_parse(s, strlen(s), &m, err, sizeof(err));

    if (r != ref_rejects[i].code || !strstr(err, ref_rejects[i].msg))
      fail_msg("case %zu (%s -> %s): got %d '%s', want %d '%s'", i,
               ref_rejects[i].from, ref_rejects[i].to, r, err,
               ref_rejects[i].code, ref_rejects[i].msg);
    assert_ptr_equal(m, (void *)1);
    free(s);
  }
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse_base),
      cmocka_unit_test(test_epoch),
      cmocka_unit_test(test_build_roundtrip),
      cmocka_unit_test(test_builder_rejects),
      cmocka_unit_test(test_parse_rejects),
      cmocka_unit_test(test_parse_shapes),
      cmocka_unit_test(test_names),
      cmocka_unit_test(test_links),
      cmocka_unit_test(test_limits),
      cmocka_unit_test(test_packs_parse),
      cmocka_unit_test(test_packs_build),
      cmocka_unit_test(test_packs_reject),
      cmocka_unit_test(test_name_step),
      cmocka_unit_test(test_step),
      cmocka_unit_test(test_marker),
      cmocka_unit_test(test_refs),
      cmocka_unit_test(test_refs_reject),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
