/* The wire's decode step: what a request may decode into is counted on its bytes first (fields,
 * packed elements, unknown fields) and a request over the bound is refused, with its id, before
 * protobuf-c allocates anything; requests within it decode as before. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "attnd.pb-c.h"
#include "wire/wire.h"
#include "pbwire.h"

static char msg[256];

static Attnd__Request *decode(const uint8_t *buf, size_t len, uint32_t max, uint64_t *id,
                              attnd_err *code)
{
    msg[0] = '\0';
    return attnd_wire_decode_max(buf, len, max, id, code, msg, sizeof msg);
}

/* A BeginStep of n entries (seq_id i + 1, one new token each). */
static uint8_t *begin_step(size_t n, uint64_t id, size_t *len)
{
    Attnd__Request req = ATTND__REQUEST__INIT;
    Attnd__BeginStep bs = ATTND__BEGIN_STEP__INIT;
    Attnd__StepSeq *e = calloc(n, sizeof *e), **ep = calloc(n, sizeof *ep);
    for (size_t i = 0; i < n; i++) {
        attnd__step_seq__init(&e[i]);
        e[i].seq_id = i + 1;
        e[i].new_tokens = 1;
        ep[i] = &e[i];
    }
    bs.n_seqs = n;
    bs.seqs = ep;
    req.id = id;
    req.session = 9;
    req.body_case = ATTND__REQUEST__BODY_BEGIN_STEP;
    req.begin_step = &bs;
    *len = attnd__request__get_packed_size(&req);
    uint8_t *buf = malloc(*len);
    attnd__request__pack(&req, buf);
    free(e);
    free(ep);
    return buf;
}

Test(wire, requests_within_the_bound_decode, .timeout = 30)
{
    size_t len;
    uint64_t id;
    attnd_err code;
    uint8_t *buf = begin_step(256, 41, &len);
    Attnd__Request *req = decode(buf, len, ATTND_WIRE_MAX_ELEMENTS_DEFAULT, &id, &code);
    cr_assert_not_null(req, "%s", msg);
    cr_assert_eq(code, ATTND_ERR_OK);
    cr_assert_eq(id, 41);
    cr_assert_eq(req->begin_step->n_seqs, 256);
    cr_assert_eq(req->begin_step->seqs[255]->seq_id, 256);
    attnd__request__free_unpacked(req, NULL);
    /* the default entry point has the default bound */
    req = attnd_wire_decode(buf, len, &id, &code, msg, sizeof msg);
    cr_assert_not_null(req, "%s", msg);
    attnd__request__free_unpacked(req, NULL);
    free(buf);
}

Test(wire, entries_over_the_bound_are_refused_with_the_id, .timeout = 30)
{
    size_t len;
    uint64_t id;
    attnd_err code;
    /* 1000 entries of 3 fields each: 1 + 1 + 1 + 1000 * 3 ... = 3004 elements */
    uint8_t *buf = begin_step(1000, 42, &len);
    cr_assert_null(decode(buf, len, 3000, &id, &code));
    cr_assert_eq(code, ATTND_ERR_PROTOCOL);
    cr_assert_eq(id, 42, "the refusal carries the request's id");
    cr_assert_not_null(strstr(msg, "more than 3000 elements"), "%s", msg);
    Attnd__Request *req = decode(buf, len, 3004, &id, &code);
    cr_assert_not_null(req, "exactly at the bound: %s", msg);
    attnd__request__free_unpacked(req, NULL);
    free(buf);
}

Test(wire, packed_elements_and_unknown_fields_count, .timeout = 30)
{
    uint64_t id;
    attnd_err code;
    /* Request{id 7, attend{q: TensorRef{shape: 100000 packed zeros}}} */
    size_t n = 100000, h = 0;
    uint8_t *buf = malloc(2 * n), inner[16];
    size_t ih = 0;
    inner[ih++] = 0x22; /* TensorRef.shape = 4, packed */
    ih += attnd_pb_put_varint(inner + ih, n);
    buf[h++] = 0x08;
    buf[h++] = 7;
    buf[h++] = 0x9a; /* attend = 19, length-delimited */
    buf[h++] = 0x01;
    h += attnd_pb_put_varint(buf + h, 1 + attnd_pb_put_varint((uint8_t[10]){0}, ih + n) + ih + n);
    buf[h++] = 0x1a; /* Attend.q = 3 */
    h += attnd_pb_put_varint(buf + h, ih + n);
    memcpy(buf + h, inner, ih);
    h += ih;
    memset(buf + h, 0, n);
    h += n;
    cr_assert_null(decode(buf, h, 65536, &id, &code));
    cr_assert_eq(id, 7);
    cr_assert_not_null(strstr(msg, "elements"), "%s", msg);
    /* 100000 unknown (empty) fields at the top level: counted too, refused before unpacking */
    h = 0;
    buf[h++] = 0x08;
    buf[h++] = 8;
    for (size_t i = 0; i < n / 2; i++) {
        buf[h++] = 0xfa; /* field 127, length-delimited, empty */
        buf[h++] = 0x07;
        buf[h++] = 0x00;
    }
    cr_assert_null(decode(buf, h, 1000, &id, &code));
    cr_assert_eq(id, 8);
    cr_assert_not_null(strstr(msg, "elements"), "%s", msg);
    /* a few unknown fields are still refused by name */
    cr_assert_null(decode(buf, 2 + 3 * 4, 1000, &id, &code));
    cr_assert_not_null(strstr(msg, "unknown field 127"), "%s", msg);
    free(buf);
}

Test(wire, bytes_that_are_no_request_are_refused, .timeout = 30)
{
    uint64_t id;
    attnd_err code;
    size_t len;
    static const uint8_t group[] = {0x0b, 0x0c};                /* a group: not in proto3 */
    static const uint8_t overlong[] = {0x0a, 0x10, 0x01, 0x02}; /* length past the end */
    static const uint8_t varint[] = {0x08, 0xff, 0xff, 0xff, 0xff, 0xff,
                                     0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    cr_assert_null(decode(group, sizeof group, 1000, &id, &code));
    cr_assert_eq(code, ATTND_ERR_PROTOCOL);
    cr_assert_not_null(strstr(msg, "not an attnd.Request"), "%s", msg);
    cr_assert_null(decode(overlong, sizeof overlong, 1000, &id, &code));
    cr_assert_null(decode(varint, sizeof varint, 1000, &id, &code));
    uint8_t *buf = begin_step(10, 5, &len);
    cr_assert_null(decode(buf, len - 1, 1000, &id, &code), "truncated");
    cr_assert_eq(code, ATTND_ERR_PROTOCOL);
    free(buf);
}
