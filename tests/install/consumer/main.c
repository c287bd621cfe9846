/* A program built against an installed attnd (tests/install/check_install.sh): the error helpers
 * and a client alone, then with `--connect [URL]` one step through a running daemon (URL absent:
 * the library's default, $ATTND_URL). The daemon's geometry: 1-token steps (v small integers, exact
 * in its f16 cache) whose output must equal v (softmax over one key). */
#include <attnd/client.h>
#include <stdio.h>
#include <string.h>

#define HEAD 32

static int fail(attnd_client *c, const char *what, attnd_err rv)
{
    fprintf(stderr, "consumer: %s: %s: %s\n", what, attnd_err_name(rv),
            c != NULL ? attnd_client_last_error(c) : attnd_strerror(rv));
    attnd_client_free(c);
    return 1;
}

/* One 1-token step over every layer, inline tensors; out must be v for every q head. */
static int one_step(attnd_client *c, const attnd_server_info *si)
{
    const attnd_geometry *g = &si->geometry;
    float q[8 * HEAD], kv[8 * HEAD], out[8 * HEAD];
    int64_t qs[3] = {1, g->num_q_heads, HEAD}, ks[3] = {1, g->num_kv_heads, HEAD};
    attnd_ref rq, rk, rv_, ro;
    attnd_step_seq seq = {42, 1};
    attnd_step step;
    attnd_err rv;
    if (g->head_size != HEAD || g->num_q_heads > 8 || g->num_kv_heads != 1)
        return fail(c, "geometry", ATTND_ERR_FAILED_PRECONDITION);
    for (int i = 0; i < 8 * HEAD; i++) {
        q[i] = (float)(i % 7) * 0.25f;
        kv[i] = (float)(i % 5) - 2.0f;
    }
    attnd_ref_inline_in(&rq, q, ATTND_DTYPE_F32, 3, qs);
    attnd_ref_inline_in(&rk, kv, ATTND_DTYPE_F32, 3, ks);
    attnd_ref_inline_in(&rv_, kv, ATTND_DTYPE_F32, 3, ks);
    attnd_ref_inline_out(&ro, out, ATTND_DTYPE_F32, 3, qs);
    if ((rv = attnd_client_seq_create(c, seq.seq_id, NULL)) != ATTND_ERR_OK)
        return fail(c, "seq_create", rv);
    if ((rv = attnd_client_step_begin(c, &seq, 1, &step, NULL)) != ATTND_ERR_OK)
        return fail(c, "step_begin", rv);
    for (uint32_t l = 0; l < g->num_layers; l++)
        if ((rv = attnd_client_attend(c, step.id, l, &rq, &rk, &rv_, &ro, NULL)) != ATTND_ERR_OK)
            return fail(c, "attend", rv);
    if ((rv = attnd_client_step_end(c, step.id, 0)) != ATTND_ERR_OK) return fail(c, "step_end", rv);
    for (uint32_t h = 0; h < g->num_q_heads; h++)
        if (memcmp(&out[h * HEAD], kv, sizeof(float) * HEAD) != 0)
            return fail(c, "attend: out differs from v", ATTND_ERR_INTERNAL);
    if ((rv = attnd_client_seq_free(c, seq.seq_id)) != ATTND_ERR_OK) return fail(c, "free", rv);
    return 0;
}

int main(int argc, char **argv)
{
    attnd_client *c = NULL;
    attnd_server_info si;
    attnd_err rv;
    if (strcmp(attnd_err_name(ATTND_ERR_UNAVAILABLE), "UNAVAILABLE") != 0 ||
        strcmp(attnd_strerror(ATTND_ERR_TIMEOUT), "timed out") != 0 ||
        strcmp(attnd_dtype_name(ATTND_DTYPE_BF16), "bf16") != 0)
        return fail(NULL, "error / dtype names", ATTND_ERR_INTERNAL);
    if ((rv = attnd_client_alloc(&c, NULL)) != ATTND_ERR_OK) return fail(NULL, "alloc", rv);
    if (argc > 1 && strcmp(argv[1], "--connect") == 0) {
        if ((rv = attnd_client_connect(c, argc > 2 ? argv[2] : NULL, &si)) != ATTND_ERR_OK)
            return fail(c, "connect", rv);
        if (one_step(c, &si) != 0) return 1;
        printf("consumer: attnd %s (%s): %u layer(s), one step ok\n", si.version, si.backend,
               si.geometry.num_layers);
    } else {
        printf("consumer: %s, client allocated\n", attnd_strerror(ATTND_ERR_OK));
    }
    attnd_client_free(c);
    return 0;
}
