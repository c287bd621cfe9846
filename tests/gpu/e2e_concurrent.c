/* Several GPU workers at once through one daemon: the executor queues a request's kernels while
 * the last ones run and replies as their fences pass, uploads step plans without waiting, and
 * serves channels and the socket side by side. Whatever the interleaving, every client must
 * get, bit for bit, what it gets alone: the same inputs (one seed for all) through a solo run
 * first, then NCLIENTS at once, half of them over the shared-memory channel and half over the
 * socket. Each output is hashed (FNV-1a over its bytes) right after its reply. */
#include "e2e_concurrent.h"

#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnd/client.h"
#include "testutil.h"

#define CC_LAYERS 32
#define CC_HQ 32
#define CC_HK 8
#define CC_HD 128
#define CC_SEQS 8
#define CC_PREFILL 96
#define CC_STEPS 13 /* one prefill, then decodes */
#define CC_ROWS (CC_SEQS * CC_PREFILL)

typedef struct cc_client {
    const attnd_daemon_proc *d;
    int id, socket_only;
    uint64_t hash[CC_STEPS][CC_LAYERS];
    char error[256];
} cc_client;

static uint64_t fnv1a(const uint8_t *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static int cc_fail(cc_client *c, const char *what)
{
    snprintf(c->error, sizeof c->error, "client %d (%s): %s", c->id,
             c->socket_only ? "socket" : "channel", what);
    return -1;
}

/* One step: BeginStep, every layer's Attend (its output hashed), EndStep (commit). */
static int cc_step(cc_client *c, attnd_client *cl, int step, char *dbuf, uint8_t *host)
{
    attnd_step_seq seqs[CC_SEQS];
    attnd_step st;
    uint64_t per = step == 0 ? CC_PREFILL : 1;
    for (int s = 0; s < CC_SEQS; s++)
        seqs[s] = (attnd_step_seq){(uint64_t)(c->id + 1) * 100 + (uint64_t)s, (uint32_t)per};
    if (attnd_client_step_begin(cl, seqs, CC_SEQS, &st, NULL) != ATTND_ERR_OK)
        return cc_fail(c, attnd_client_last_error(cl));
    int64_t T = st.num_tokens, sq[3] = {T, CC_HQ, CC_HD}, sk[3] = {T, CC_HK, CC_HD};
    size_t qb = (size_t)CC_ROWS * CC_HQ * CC_HD * 2, kb = (size_t)CC_ROWS * CC_HK * CC_HD * 2;
    attnd_ref q, k, v, out;
    attnd_ref_region(&q, 1, 0, ATTND_DTYPE_BF16, 3, sq);
    attnd_ref_region(&k, 1, qb, ATTND_DTYPE_BF16, 3, sk);
    attnd_ref_region(&v, 1, qb + kb, ATTND_DTYPE_BF16, 3, sk);
    attnd_ref_region(&out, 1, qb + 2 * kb, ATTND_DTYPE_BF16, 3, sq);
    for (int l = 0; l < CC_LAYERS; l++) {
        if (attnd_client_attend(cl, st.id, (uint32_t)l, &q, &k, &v, &out, NULL) != ATTND_ERR_OK)
            return cc_fail(c, attnd_client_last_error(cl));
        size_t ob = (size_t)T * CC_HQ * CC_HD * 2;
        if (cudaMemcpy(host, dbuf + qb + 2 * kb, ob, cudaMemcpyDeviceToHost) != cudaSuccess)
            return cc_fail(c, "cudaMemcpy");
        c->hash[step][l] = fnv1a(host, ob);
    }
    if (attnd_client_step_end(cl, st.id, 0) != ATTND_ERR_OK)
        return cc_fail(c, attnd_client_last_error(cl));
    return 0;
}

static int cc_session(cc_client *c, attnd_client *cl, char *dbuf, uint8_t *host)
{
    cudaIpcMemHandle_t h;
    size_t bytes = (size_t)CC_ROWS * (2 * CC_HQ + 2 * CC_HK) * CC_HD * 2;
    if (cudaIpcGetMemHandle(&h, dbuf) != cudaSuccess) return cc_fail(c, "cudaIpcGetMemHandle");
    if (attnd_client_region_register_cuda(cl, 1, &h, bytes, 0) != ATTND_ERR_OK)
        return cc_fail(c, attnd_client_last_error(cl));
    for (int s = 0; s < CC_SEQS; s++)
        if (attnd_client_seq_create(cl, (uint64_t)(c->id + 1) * 100 + (uint64_t)s, NULL))
            return cc_fail(c, attnd_client_last_error(cl));
    for (int step = 0; step < CC_STEPS; step++)
        if (cc_step(c, cl, step, dbuf, host) != 0) return -1;
    return 0;
}

static void *cc_run(void *arg)
{
    cc_client *c = arg;
    size_t in = (size_t)CC_ROWS * (CC_HQ + 2 * CC_HK) * CC_HD;
    size_t bytes = in * 2 + (size_t)CC_ROWS * CC_HQ * CC_HD * 2;
    uint16_t *h = malloc(bytes);
    char *dbuf = NULL;
    attnd_rng rng;
    attnd_rng_seed(&rng, 777); /* every client the same inputs */
    for (size_t i = 0; h && i < in; i++)
        h[i] = attnd_f32_to_bf16((float)attnd_rng_normal(&rng));
    attnd_client *cl = attnd_daemon_connect(c->d, 60000);
    if (h == NULL || cl == NULL || cudaMalloc((void **)&dbuf, bytes) != cudaSuccess ||
        cudaMemcpy(dbuf, h, in * 2, cudaMemcpyHostToDevice) != cudaSuccess) {
        cc_fail(c, "setup");
    } else if (c->socket_only && attnd_client_channel_close(cl) != ATTND_ERR_OK) {
        cc_fail(c, "channel close");
    } else if (!c->socket_only && !attnd_client_channel_active(cl)) {
        cc_fail(c, "no channel on ipc://");
    } else {
        cc_session(c, cl, dbuf, (uint8_t *)h);
    }
    attnd_client_free(cl);
    cudaFree(dbuf);
    free(h);
    return NULL;
}

int attnd_e2e_concurrent(const attnd_daemon_proc *d, char *report, size_t n)
{
    cc_client *cs = calloc(NCLIENTS + 1, sizeof *cs);
    pthread_t th[NCLIENTS];
    int bad = 0;
    if (cs == NULL) return -1;
    for (int i = 0; i <= NCLIENTS; i++)
        cs[i] = (cc_client){.d = d, .id = i, .socket_only = i % 2};
    cs[0].socket_only = 0;
    cc_run(&cs[0]); /* alone: the reference */
    for (int i = 1; i <= NCLIENTS; i++)
        pthread_create(&th[i - 1], NULL, cc_run, &cs[i]);
    for (int i = 1; i <= NCLIENTS; i++)
        pthread_join(th[i - 1], NULL);
    snprintf(report, n,
             "%d clients at once (%d over channels, %d over the socket) x %d steps x %d "
             "layers: outputs bit-identical to a solo run",
             NCLIENTS, (NCLIENTS + 1) / 2, NCLIENTS / 2, CC_STEPS, CC_LAYERS);
    for (int i = 0; i <= NCLIENTS && !bad; i++)
        if (cs[i].error[0]) {
            snprintf(report, n, "%s", cs[i].error);
            bad = 1;
        } else if (i > 0 && memcmp(cs[i].hash, cs[0].hash, sizeof cs[0].hash) != 0) {
            snprintf(report, n, "client %d (%s): outputs differ from the solo run", i,
                     cs[i].socket_only ? "socket" : "channel");
            bad = 1;
        }
    free(cs);
    return bad;
}
