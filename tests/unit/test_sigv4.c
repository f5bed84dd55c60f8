/* SigV4 against AWS's published vectors: the generic test suite
 * (AKIDEXAMPLE, 20150830T123600Z, service "service") and the S3 examples
 * of the "Signature Calculations for the Authorization Header" page
 * (AKIAIOSFODNN7EXAMPLE, 20130524T000000Z, examplebucket). */
#include "cmocka-compat.h"

#include <errno.h>
#include <string.h>

#include "core/buf.h"
#include "core/sigv4.h"

#define SUITE_AK "AKIDEXAMPLE"
#define SUITE_SK "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
#define SUITE_DATE "20150830T123600Z"
#define SUITE_PREFIX                                                           \
  "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/"        \
  "aws4_request, SignedHeaders=host;x-amz-date, Signature="

static const struct spot__sigv4_header suite_headers[] = {
    {"Host", "example.amazonaws.com"},
    {"X-Amz-Date", SUITE_DATE},
};

static void
check_suite(const char *method, const char *path, const char *query,
            const char *signature)
{
  struct spot__sigv4_request req = {
      .method = method,
      .path = path,
      .query = query,
      .headers = suite_headers,
      .n_headers = 2,
      .payload_hash = SPOT__SHA256_EMPTY,
  };
  struct spot_buf auth;

  spot_buf_init(&auth, 4096);
  assert_int_equal(spot__sigv4_authorization(SUITE_AK, SUITE_SK, SUITE_DATE,
                                             "us-east-1", "service", &req,
                                             &auth),
                   0);
  assert_true(
      strncmp(spot_buf_str(&auth), SUITE_PREFIX, strlen(SUITE_PREFIX)) == 0);
  assert_string_equal(spot_buf_str(&auth) + strlen(SUITE_PREFIX), signature);
  spot_buf_fini(&auth);
}

static void
test_get_vanilla_steps(void **state)
{
  struct spot__sigv4_request req = {
      .method = "GET",
      .path = "/",
      .headers = suite_headers,
      .n_headers = 2,
      .payload_hash = SPOT__SHA256_EMPTY,
  };
  struct spot_buf creq, sts, names;
  char sig[65];

  spot_buf_init(&creq, 4096);
  spot_buf_init(&sts, 4096);
  spot_buf_init(&names, 4096);
  assert_int_equal(spot__sigv4_canonical_request(&req, &creq, &names), 0);
  assert_string_equal(
      spot_buf_str(&creq),
      "GET\n/\n\nhost:example.amazonaws.com\n"
      "x-amz-date:20150830T123600Z\n\nhost;x-amz-date\n" SPOT__SHA256_EMPTY);
  assert_string_equal(spot_buf_str(&names), "host;x-amz-date");
  assert_int_equal(spot__sigv4_string_to_sign(SUITE_DATE, "us-east-1",
                                              "service", spot_buf_str(&creq),
                                              &sts),
                   0);
  assert_string_equal(
      spot_buf_str(&sts),
      "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/"
      "aws4_request\n"
      "bb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63");
  assert_int_equal(spot__sigv4_signature(SUITE_SK, SUITE_DATE, "us-east-1",
                                         "service", spot_buf_str(&sts), sig),
                   0);
  assert_string_equal(
      sig, "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31");
  assert_int_equal(spot__sigv4_string_to_sign("2015-08-30", "us-east-1",
                                              "service", "x", &sts),
                   -EINVAL);
  spot_buf_fini(&creq);
  spot_buf_fini(&sts);
  spot_buf_fini(&names);
}

static void
test_suite_vectors(void **state)
{
  check_suite(
      "GET", "/", NULL,
      "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31");
  /* get-vanilla-query-order-key-case: sorted by name, case-sensitive */
  check_suite(
      "GET", "/", "Param2=value2&Param1=value1",
      "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500");
  /* get-vanilla-empty-query-key */
  check_suite(
      "GET", "/", "Param1=value1",
      "a67d582fa61cc504c4bae71f336f98b97f1ea3c7a6bfe1b6e45aec72011b9aeb");
  /* get-utf8: the path's UTF-8 bytes percent-encoded */
  check_suite(
      "GET", "/\xe1\x88\xb4", NULL,
      "8318018e0b0f223aa2bbf98705b62bb787dc9c0e678f255a891fd03141be5d85");
  /* the same, already encoded by us: no double encoding */
  check_suite(
      "GET", "/%E1%88%B4", NULL,
      "8318018e0b0f223aa2bbf98705b62bb787dc9c0e678f255a891fd03141be5d85");
  /* get-space */
  check_suite(
      "GET", "/example space/", NULL,
      "652487583200325589f1fba4c7e578f72c47cb61beeca81406b39ddec1366741");
  check_suite(
      "GET", "/example%20space/", NULL,
      "652487583200325589f1fba4c7e578f72c47cb61beeca81406b39ddec1366741");
  /* get-vanilla-utf8-query */
  check_suite(
      "GET", "/", "\xe1\x88\xb4=bar",
      "2cdec8eed098649ff3a119c94853b13c643bcf08f8b0a1d91e12c9027818dd04");
  /* get-vanilla-query-unreserved */
  check_suite(
      "GET", "/",
      "-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz="
      "-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
      "9c3e54bfcdf0b19771a7f523ee5669cdf59bc7cc0884027167c21bb143a40197");
  /* get-vanilla-query-order-encoded: sorted on the encoded names */
  check_suite(
      "GET", "/", "Param-3=Value3&Param=Value2&%E1%88%B4=Value1",
      "371d3713e185cc334048618a97f809c9ffe339c62934c032af5a0e595648fcac");
  /* post-vanilla, post-vanilla-query */
  check_suite(
      "POST", "/", NULL,
      "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b");
  check_suite(
      "POST", "/", "Param1=value1",
      "28038455d6de14eafc1f9222cf5aa6f1a96197d7deb8263271d420d138af7f11");
}

#define S3_AK "AKIAIOSFODNN7EXAMPLE"
#define S3_SK "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
#define S3_DATE "20130524T000000Z"

static void
check_s3(const char *method, const char *path, const char *query,
         const struct spot__sigv4_header *h, size_t n, const char *payload,
         const char *signed_headers, const char *sts_hash, const char *sig)
{
  struct spot__sigv4_request req = {
      .method = method,
      .path = path,
      .query = query,
      .headers = h,
      .n_headers = n,
      .payload_hash = payload,
  };
  struct spot_buf creq, sts, names, auth, want;
  char got[65];

  spot_buf_init(&creq, 8192);
  spot_buf_init(&sts, 4096);
  spot_buf_init(&names, 4096);
  spot_buf_init(&auth, 4096);
  spot_buf_init(&want, 4096);
  assert_int_equal(spot__sigv4_canonical_request(&req, &creq, &names), 0);
  assert_string_equal(spot_buf_str(&names), signed_headers);
  assert_int_equal(spot__sigv4_string_to_sign(S3_DATE, "us-east-1", "s3",
                                              spot_buf_str(&creq), &sts),
                   0);
  assert_string_equal(spot_buf_str(&sts) + strlen(spot_buf_str(&sts)) - 64,
                      sts_hash);
  assert_int_equal(spot__sigv4_signature(S3_SK, S3_DATE, "us-east-1", "s3",
                                         spot_buf_str(&sts), got),
                   0);
  assert_string_equal(got, sig);
  assert_int_equal(spot__sigv4_authorization(S3_AK, S3_SK, S3_DATE, "us-east-1",
                                             "s3", &req, &auth),
                   0);
  assert_int_equal(
      spot_buf_printf(&want,
                      "AWS4-HMAC-SHA256 Credential=" S3_AK
                      "/20130524/us-east-1/s3/aws4_request, SignedHeaders=%s, "
                      "Signature=%s",
                      signed_headers, sig),
      0);
  assert_string_equal(spot_buf_str(&auth), spot_buf_str(&want));
  spot_buf_fini(&creq);
  spot_buf_fini(&sts);
  spot_buf_fini(&names);
  spot_buf_fini(&auth);
  spot_buf_fini(&want);
}

static void
test_s3_examples(void **state)
{
  const struct spot__sigv4_header get_h[] = {
      {"Host", "examplebucket.s3.amazonaws.com"},
      {"Range", "bytes=0-9"},
      {"x-amz-content-sha256", SPOT__SHA256_EMPTY},
      {"x-amz-date", S3_DATE},
  };
  const char body[] = "Welcome to Amazon S3.";
  char body_hash[65];
  const struct spot__sigv4_header put_h[] = {
      {"Host", "examplebucket.s3.amazonaws.com"},
      {"Date", "Fri, 24 May 2013 00:00:00 GMT"},
      {"x-amz-date", S3_DATE},
      {"x-amz-storage-class", "REDUCED_REDUNDANCY"},
      {"x-amz-content-sha256", body_hash},
  };
  const struct spot__sigv4_header bucket_h[] = {
      {"Host", "examplebucket.s3.amazonaws.com"},
      {"x-amz-date", S3_DATE},
      {"x-amz-content-sha256", SPOT__SHA256_EMPTY},
  };

  check_s3("GET", "/test.txt", NULL, get_h, 4, SPOT__SHA256_EMPTY,
           "host;range;x-amz-content-sha256;x-amz-date",
           "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972",
           "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");

  spot__sha256_hex(body, strlen(body), body_hash);
  assert_string_equal(
      body_hash,
      "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
  /* '$' in a key is encoded */
  check_s3("PUT", "/test$file.text", NULL, put_h, 5, body_hash,
           "date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class",
           "9e0e90d9c76de8fa5b200d8c849cd5b8dc7a3be3951ddb7f6a76b4158342019d",
           "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
  /* "?lifecycle" signs as "lifecycle=": why we always write the '=' */
  check_s3("GET", "/", "lifecycle", bucket_h, 3, SPOT__SHA256_EMPTY,
           "host;x-amz-content-sha256;x-amz-date",
           "9766c798316ff2757b517bc739a67f6213b4ab36dd5da2f94eaebf79c77395ca",
           "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
  check_s3("GET", "/", "lifecycle=", bucket_h, 3, SPOT__SHA256_EMPTY,
           "host;x-amz-content-sha256;x-amz-date",
           "9766c798316ff2757b517bc739a67f6213b4ab36dd5da2f94eaebf79c77395ca",
           "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
  check_s3("GET", "/", "max-keys=2&prefix=J", bucket_h, 3, SPOT__SHA256_EMPTY,
           "host;x-amz-content-sha256;x-amz-date",
           "df57d21db20da04d7fa30298dd4488ba3a2b47ca3a489c74750e0f1e7df1b9b7",
           "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}

static void
test_canonical_headers(void **state)
{
  /* trimmed, inner spaces collapsed, same names joined in order */
  const struct spot__sigv4_header h[] = {
      {"My-Header1", "  value1  "},
      {"my-header2", "\"a   b   c\""},
      {"My-Header1", "value2"},
      {"Host", "h"},
  };
  struct spot__sigv4_request req = {
      .method = "GET",
      .path = "/",
      .headers = h,
      .n_headers = 4,
      .payload_hash = "UNSIGNED-PAYLOAD",
  };
  struct spot_buf creq;

  spot_buf_init(&creq, 4096);
  assert_int_equal(spot__sigv4_canonical_request(&req, &creq, NULL), 0);
  assert_string_equal(spot_buf_str(&creq),
                      "GET\n/\n\nhost:h\nmy-header1:value1,value2\n"
                      "my-header2:\"a b c\"\n\nhost;my-header1;my-header2\n"
                      "UNSIGNED-PAYLOAD");
  spot_buf_fini(&creq);
}

static void
test_encoding(void **state)
{
  struct spot_buf b;

  spot_buf_init(&b, 4096);
  assert_int_equal(spot__uri_encode_n("a b+c/~d=e&f", 12, true, &b), 0);
  assert_string_equal(spot_buf_str(&b), "a%20b%2Bc/~d%3De%26f");
  spot_buf_reset(&b);
  assert_int_equal(spot__uri_encode_n("a b+c/~d=e&f", 12, false, &b), 0);
  assert_string_equal(spot_buf_str(&b), "a%20b%2Bc%2F~d%3De%26f");
  spot_buf_reset(&b);
  assert_int_equal(spot__uri_encode_n("\xc3\xa9t\xc3\xa9", 5, false, &b), 0);
  assert_string_equal(spot_buf_str(&b), "%C3%A9t%C3%A9");
  spot_buf_reset(&b);
  /* '+' in a query is a plus, never a space */
  assert_int_equal(spot__uri_decode_n("a+b%2b%20", 9, &b), 0);
  assert_string_equal(spot_buf_str(&b), "a+b+ ");
  spot_buf_reset(&b);
  assert_int_equal(spot__uri_decode_n("bad%2", 5, &b), -EINVAL);
  spot_buf_reset(&b);
  assert_int_equal(spot__uri_decode_n("bad%zz", 6, &b), -EINVAL);
  spot_buf_reset(&b);
  /* canonical query: sorted, re-encoded, idempotent */
  assert_int_equal(spot__sigv4_canonical_query("uploadId=a+b&partNumber=3", &b),
                   0);
  assert_string_equal(spot_buf_str(&b), "partNumber=3&uploadId=a%2Bb");
  spot_buf_reset(&b);
  assert_int_equal(spot__sigv4_canonical_query("b=2&a=x y&a=1&c", &b), 0);
  assert_string_equal(spot_buf_str(&b), "a=1&a=x%20y&b=2&c=");
  spot_buf_fini(&b);
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_get_vanilla_steps),
      cmocka_unit_test(test_suite_vectors),
      cmocka_unit_test(test_s3_examples),
      cmocka_unit_test(test_canonical_headers),
      cmocka_unit_test(test_encoding),
  };

  return cmocka_run_group_tests(tests, NULL, NULL);
}
