#include "wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnd/clock.h"

void attnd_wire_init(attnd_wire *w, const attnd_wire_handler *handler, attnd_log *lg)
{
    memset(w, 0, sizeof *w);
    w->handler = *handler;
    w->log = lg;
    atomic_init(&w->max_elements, ATTND_WIRE_MAX_ELEMENTS_DEFAULT);
}

void attnd_wire_set_max_elements(attnd_wire *w, uint32_t max_elements)
{
    atomic_store(&w->max_elements, max_elements);
}

uint32_t attnd_wire_max_elements(attnd_wire *w)
{
    return atomic_load(&w->max_elements);
}

void attnd_wire_set_observe(attnd_wire *w, attnd_observe *obs)
{
    w->obs = obs;
}

uint32_t attnd_wire_busy(attnd_wire *w)
{
    return atomic_load(&w->busy);
}

void attnd_wire_counts(attnd_wire *w, uint64_t *replies, uint64_t *ok)
{
    *replies = atomic_load(&w->replies);
    *ok = atomic_load(&w->replies_ok);
}

void attnd_wire_done(attnd_wire *w)
{
    atomic_fetch_sub(&w->busy, 1);
}

/* ---------------------------------------------------------------- requests */

/* First unknown field anywhere in the message tree (0 when none). */
static uint32_t find_unknown(const ProtobufCMessage *m, const char **where)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    const char *base = (const char *)m;
    uint32_t tag;
    if (m->n_unknown_fields) {
        *where = d->name;
        return m->unknown_fields[0].tag;
    }
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_MESSAGE) continue;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t cnt = *(const size_t *)(base + f->quantifier_offset);
            ProtobufCMessage *const *arr = *(ProtobufCMessage *const *const *)(base + f->offset);
            for (size_t j = 0; j < cnt; j++)
                if (arr[j] && (tag = find_unknown(arr[j], where))) return tag;
            continue;
        }
        if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
            *(const uint32_t *)(base + f->quantifier_offset) != f->id)
            continue;
        const ProtobufCMessage *sub = *(ProtobufCMessage *const *)(base + f->offset);
        if (sub && (tag = find_unknown(sub, where))) return tag;
    }
    return 0;
}

/* ---------------------------------------------------------------- the element bound */

/* Counting what a message decodes into, on its bytes (protobuf's wire format). */
typedef struct wire_scan {
    uint64_t elements, max;
    uint64_t id; /* the top level's field 1 (Request.id), when seen */
} wire_scan;

#define WIRE_SCAN_DEPTH 16 /* attnd.proto nests 4 deep; deeper is not a Request */

static int scan_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    uint64_t x = 0;
    for (unsigned shift = 0; shift < 70 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        x |= (uint64_t)(b & 0x7f) << (shift < 64 ? shift : 0);
        if (!(b & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return -1;
}

/* Elements of a packed repeated scalar field's payload. */
static uint64_t scan_packed(const ProtobufCFieldDescriptor *f, const uint8_t *p, size_t len)
{
    uint64_t n = 0;
    switch (f->type) {
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_FLOAT:
        return len / 4;
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return len / 8;
    default:
        for (size_t i = 0; i < len; i++)
            n += !(p[i] & 0x80);
        return n;
    }
}

static int scan_message(wire_scan *s, const ProtobufCMessageDescriptor *d, const uint8_t *p,
                        const uint8_t *end, int depth);

/* One length-delimited field (f NULL: unknown) whose payload is [p, p + len). */
static int scan_delimited(wire_scan *s, const ProtobufCFieldDescriptor *f, const uint8_t *p,
                          size_t len, int depth)
{
    if (f == NULL) return 0;
    if (f->type == PROTOBUF_C_TYPE_MESSAGE)
        return scan_message(s, f->descriptor, p, p + len, depth + 1);
    if (f->label == PROTOBUF_C_LABEL_REPEATED && f->type != PROTOBUF_C_TYPE_STRING &&
        f->type != PROTOBUF_C_TYPE_BYTES)
        s->elements += scan_packed(f, p, len);
    return 0;
}

/* Count the fields of message d in [p, end), recursing into known sub-messages; -1 on bytes
 * that are no message or once over the bound. */
static int scan_message(wire_scan *s, const ProtobufCMessageDescriptor *d, const uint8_t *p,
                        const uint8_t *end, int depth)
{
    uint64_t key, v;
    if (depth > WIRE_SCAN_DEPTH) return -1;
    while (p < end) {
        if (scan_varint(&p, end, &key)) return -1;
        const ProtobufCFieldDescriptor *f =
            key >> 3 <= UINT32_MAX ? protobuf_c_message_descriptor_get_field(d, key >> 3) : NULL;
        s->elements++;
        switch (key & 7) {
        case 0:
            if (scan_varint(&p, end, &v)) return -1;
            if (depth == 0 && (key >> 3) == 1) s->id = v;
            break;
        case 1:
            if (end - p < 8) return -1;
            p += 8;
            break;
        case 5:
            if (end - p < 4) return -1;
            p += 4;
            break;
        case 2:
            if (scan_varint(&p, end, &v) || v > (uint64_t)(end - p)) return -1;
            if (scan_delimited(s, f, p, (size_t)v, depth)) return -1;
            p += v;
            break;
        default: /* groups: protobuf-c refuses them too */
            return -1;
        }
        if (s->elements > s->max) return -1;
    }
    return 0;
}

Attnd__Request *attnd_wire_decode(const void *buf, size_t len, uint64_t *id, attnd_err *code,
                                  char *msg, size_t n)
{
    return attnd_wire_decode_max(buf, len, ATTND_WIRE_MAX_ELEMENTS_DEFAULT, id, code, msg, n);
}

Attnd__Request *attnd_wire_decode_max(const void *buf, size_t len, uint32_t max_elements,
                                      uint64_t *id, attnd_err *code, char *msg, size_t n)
{
    const char *where = "";
    uint32_t tag;
    wire_scan scan = {0, max_elements, 0};
    *id = 0;
    *code = ATTND_ERR_PROTOCOL;
    if (scan_message(&scan, &attnd__request__descriptor, buf, (const uint8_t *)buf + len, 0)) {
        if (scan.elements > scan.max) { /* well-formed as far as read: its id is known */
            *id = scan.id;
            snprintf(msg, n,
                     "request: more than %u elements (fields and repeated entries) in %zu bytes; "
                     "the bound follows limits.max_seqs",
                     max_elements, len);
        } else {
            snprintf(msg, n, "request: %zu bytes are not an attnd.Request", len);
        }
        return NULL;
    }
    Attnd__Request *req = attnd__request__unpack(NULL, len, buf);
    if (req == NULL) {
        snprintf(msg, n, "request: %zu bytes are not an attnd.Request", len);
        return NULL;
    }
    *id = req->id;
    if ((tag = find_unknown(&req->base, &where))) {
        attnd__request__free_unpacked(req, NULL);
        snprintf(msg, n, "request: unknown field %u in %s", tag, where);
        return NULL;
    }
    *code = ATTND_ERR_OK;
    return req;
}

void attnd_wire_received(attnd_wire *w, attnd_wire_call *c, const attnd_transport_ops *ops,
                         size_t len)
{
    c->ops = ops;
    c->wire = w;
    c->req_type = ATTND_METRICS_REQ_INVALID;
    c->t_recv_ns = attnd_clock_ns();
    atomic_fetch_add(&w->busy, 1);
    if (w->obs == NULL) return;
    attnd_metrics_gauge_add(attnd_observe_metrics(w->obs), ATTND_METRICS_GAUGE_INFLIGHT, 1);
    attnd_metrics_wire(attnd_observe_metrics(w->obs), len, 0);
}

void attnd_wire_deliver(attnd_wire_call *c, Attnd__Request *req, uint32_t pipe, uint64_t age_ms)
{
    attnd_wire *w = c->wire;
    w->handler.request(w->handler.arg, c, req, pipe, age_ms);
    attnd__request__free_unpacked(req, NULL);
}

/* ---------------------------------------------------------------- replies */

/* Count a reply about to go out (any thread that answers: the counters are atomics). */
static void wire_count_reply(attnd_wire_call *c, uint32_t code, size_t bytes)
{
    attnd_wire *w = c->wire;
    atomic_fetch_add_explicit(&w->replies, 1, memory_order_relaxed);
    if (code == ATTND_ERR_OK) atomic_fetch_add_explicit(&w->replies_ok, 1, memory_order_relaxed);
    if (w->obs == NULL) return;
    attnd_metrics *mt = attnd_observe_metrics(w->obs);
    attnd_metrics_request(mt, c->req_type, code, attnd_clock_ns() - c->t_recv_ns);
    attnd_metrics_wire(mt, 0, bytes);
    attnd_metrics_gauge_add(mt, ATTND_METRICS_GAUGE_INFLIGHT, -1);
    if (c->req_type == ATTND_METRICS_REQ_HELLO && code == ATTND_ERR_OK)
        attnd_metrics_event(mt, ATTND_METRICS_EVENT_SESSIONS_OPENED);
    if (c->req_type == ATTND_METRICS_REQ_HELLO && code == ATTND_ERR_PERMISSION_DENIED)
        attnd_metrics_event(mt, ATTND_METRICS_EVENT_AUTH_FAILURES);
}

/* Nothing to send with: the call ends unanswered and its client times out. */
static void wire_drop(attnd_wire_call *c, uint64_t id)
{
    attnd_wire *w = c->wire;
    ATTND_LOG(w->log, ATTND_LOG_ERROR, "event=reply_dropped id=%llu reason=no_memory",
              (unsigned long long)id);
    if (w->obs) {
        attnd_metrics_gauge_add(attnd_observe_metrics(w->obs), ATTND_METRICS_GAUGE_INFLIGHT, -1);
        attnd_metrics_event(attnd_observe_metrics(w->obs), ATTND_METRICS_EVENT_DROPPED_MESSAGES);
    }
    c->ops->reply_drop(c);
}

void attnd_wire_reply(attnd_wire_call *c, const Attnd__Reply *rep)
{
    Attnd__Reply small = ATTND__REPLY__INIT;
    char msg[160];
    size_t n = attnd__reply__get_packed_size(rep), cap = c->ops->reply_cap(c);
    void *buf = n <= cap ? c->ops->reply_buf(c, n) : NULL;
    if (buf == NULL) {
        snprintf(msg, sizeof msg, "reply: %zu bytes %s (the request ran)", n,
                 n > cap ? "exceed the channel's reply area" : "cannot be allocated");
        small.id = rep->id;
        small.code = n > cap ? ATTND_ERR_INTERNAL : ATTND_ERR_NO_MEMORY;
        small.message = msg;
        rep = &small;
        n = attnd__reply__get_packed_size(rep);
        if ((buf = c->ops->reply_buf(c, n)) == NULL) {
            wire_drop(c, rep->id);
            return;
        }
    }
    attnd__reply__pack(rep, buf);
    wire_count_reply(c, rep->code, n);
    /* before it leaves: the client's next message may be one only a Hello allows */
    if (c->req_type == ATTND_METRICS_REQ_HELLO && rep->code == ATTND_ERR_OK && c->ops->hello_ok)
        c->ops->hello_ok(c);
    c->ops->reply_send(c, buf, n);
}

void attnd_wire_fail(attnd_wire_call *c, uint64_t id, attnd_err code, const char *msg)
{
    attnd_wire *w = c->wire;
    Attnd__Reply rep = ATTND__REPLY__INIT;
    char key[48];
    uint64_t suppressed = 0;
    rep.id = id;
    rep.code = (uint32_t)code;
    rep.message = (char *)msg;
    /* a client sending garbage in a loop costs one line per second per code, not one per message */
    snprintf(key, sizeof key, "request:%s", attnd_err_name(code));
    if (w->obs == NULL || attnd_observe_log_allowed(w->obs, key, &suppressed))
        ATTND_LOG(
            w->log, ATTND_LOG_INFO, "event=request id=%llu code=%s msg=\"%s\" suppressed=%llu",
            (unsigned long long)id, attnd_err_name(code), msg, (unsigned long long)suppressed);
    attnd_wire_reply(c, &rep);
}
