/* A client to be killed: connects to URL, creates sequences 1 (5 tokens) and 2 (17 tokens),
 * begins a step over both, writes layer 0 (Attend), prints "mid-step session=<id>" and waits
 * to be killed (test_faults sends SIGKILL). Exits 1 if any call fails, 2 if never killed.
 *   usage: attnd_fault_client URL
 * A separate program (not a fork of the test) so the test's NNG threads never cross a fork. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "attnd/client.h"

static int step_and_attend(attnd_client *c)
{
    const attnd_geometry *g = &attnd_client_server(c)->geometry;
    attnd_step_seq ss[2] = {{1, 5}, {2, 17}};
    attnd_step step;
    if (attnd_client_seq_create(c, 1, NULL) != ATTND_ERR_OK ||
        attnd_client_seq_create(c, 2, NULL) != ATTND_ERR_OK ||
        attnd_client_step_begin(c, ss, 2, &step, NULL) != ATTND_ERR_OK)
        return -1;
    int64_t qs[3] = {step.num_tokens, g->num_q_heads, g->head_size};
    int64_t ks[3] = {step.num_tokens, g->num_kv_heads, g->head_size};
    float *q = calloc((size_t)(qs[0] * qs[1] * qs[2]), sizeof(float));
    float *k = calloc((size_t)(ks[0] * ks[1] * ks[2]), sizeof(float));
    attnd_ref rq, rk, rv, ro;
    attnd_ref_inline_in(&rq, q, ATTND_DTYPE_F32, 3, qs);
    attnd_ref_inline_in(&rk, k, ATTND_DTYPE_F32, 3, ks);
    attnd_ref_inline_in(&rv, k, ATTND_DTYPE_F32, 3, ks);
    attnd_ref_inline_out(&ro, q, ATTND_DTYPE_F32, 3, qs);
    attnd_err rv_ = attnd_client_attend(c, step.id, 0, &rq, &rk, &rv, &ro, NULL);
    free(q);
    free(k);
    return rv_ == ATTND_ERR_OK ? 0 : -1;
}

int main(int argc, char **argv)
{
    attnd_client_opts opts = {.name = "fault-client", .timeout_ms = 10000};
    attnd_client *c = NULL;
    if (argc != 2) {
        fprintf(stderr, "usage: attnd_fault_client URL\n");
        return 2;
    }
    if (attnd_client_alloc(&c, &opts) != ATTND_ERR_OK ||
        attnd_client_connect(c, argv[1], NULL) != ATTND_ERR_OK || step_and_attend(c) != 0) {
        fprintf(stderr, "attnd_fault_client: %s\n", c ? attnd_client_last_error(c) : "alloc");
        return 1;
    }
    printf("mid-step session=%llu\n", (unsigned long long)attnd_client_session(c));
    fflush(stdout);
    sleep(60);
    return 2;
}
