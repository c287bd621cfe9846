/* attnctl attend: replay one step (Q/K/V from .npy files) and write the output .npy. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attnctl.h"
#include "attnd/npy.h"

#define MAX_STEP_SEQS 256
#define SHM_ALIGN 64

typedef struct attend_opts {
    const char *q, *k, *v, *out, *lse;
    attnd_step_seq seqs[MAX_STEP_SEQS];
    size_t nseqs;
    uint32_t layer;
    int have_dtype;
    attnd_dtype dtype;
    int use_inline;
} attend_opts;

/* The step's tensors, in their request dtype. */
typedef struct attend_data {
    attnd_npy q, k, v, out, lse;
    attnd_shm shm;
    int64_t tokens;
} attend_data;

static int parse_seqs(const char *s, attend_opts *o)
{
    char *copy = strdup(s), *save = NULL;
    size_t before = o->nseqs;
    int rc = ATTNCTL_OK;
    if (copy == NULL) return attnctl_usage_error("attend", "--seqs: out of memory");
    for (char *tok = strtok_r(copy, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(tok, ':');
        uint64_t id, n;
        if (colon == NULL || o->nseqs == MAX_STEP_SEQS) {
            rc = colon == NULL ? attnctl_usage_error("attend", "--seqs: '%s' is not ID:N", tok)
                               : attnctl_usage_error("attend", "--seqs: more than %d sequences",
                                                     MAX_STEP_SEQS);
            break;
        }
        *colon = '\0';
        if (attnctl_parse_u64(tok, &id) != 0 || attnctl_parse_u64(colon + 1, &n) != 0 ||
            n > UINT32_MAX) {
            rc = attnctl_usage_error("attend", "--seqs: bad entry '%s:%s' (ID:N, numbers)", tok,
                                     colon + 1);
            break;
        }
        o->seqs[o->nseqs].seq_id = id;
        o->seqs[o->nseqs++].new_tokens = (uint32_t)n;
    }
    free(copy);
    if (rc == ATTNCTL_OK && o->nseqs == before)
        rc = attnctl_usage_error("attend", "--seqs wants ID:N[,ID:N...], not '%s'", s);
    return rc;
}

static int parse_opts(int argc, char **argv, attend_opts *o)
{
    static const struct option longopts[] = {
        {"seqs", required_argument, NULL, 's'},  {"layer", required_argument, NULL, 'l'},
        {"dtype", required_argument, NULL, 'd'}, {"lse", required_argument, NULL, 'e'},
        {"inline", no_argument, NULL, 'i'},      {NULL, 0, NULL, 0}};
    const char **pos[] = {&o->q, &o->k, &o->v, &o->out};
    int c;
    memset(o, 0, sizeof *o);
    while ((c = attnctl_getopt("attend", argc, argv, ":", longopts)) != -1) {
        if (c == '?') return ATTNCTL_USAGE;
        if (c == 'i') o->use_inline = 1;
        if (c == 'e') o->lse = optarg;
        if (c == 's' && parse_seqs(optarg, o) != ATTNCTL_OK) return ATTNCTL_USAGE;
        if (c == 'l' && attnctl_opt_u32("attend", "--layer", optarg, &o->layer) != ATTNCTL_OK)
            return ATTNCTL_USAGE;
        if (c == 'd' && attnctl_parse_dtype(optarg, &o->dtype) != 0)
            return attnctl_usage_error("attend", "--dtype: unknown dtype '%s' (f32, f16, bf16)",
                                       optarg);
        o->have_dtype |= c == 'd';
    }
    if (argc - optind != 4)
        return attnctl_usage_error("attend", "needs Q.npy K.npy V.npy OUT.npy (%d given)",
                                   argc - optind);
    for (int i = 0; i < 4; i++)
        *pos[i] = argv[optind + i];
    return ATTNCTL_OK;
}

static void data_free(attend_data *d, attnctl *ctl)
{
    attnd_npy_free(&d->q);
    attnd_npy_free(&d->k);
    attnd_npy_free(&d->v);
    attnd_npy_free(&d->out);
    attnd_npy_free(&d->lse);
    if (d->shm.base != NULL) attnd_client_shm_destroy(ctl->c, &d->shm);
}

/* Read a [T, heads, head_size] file and convert it to dtype. */
static int load_input(const char *path, const char *what, int have_dtype, attnd_dtype *dtype,
                      attnd_npy *out)
{
    attnd_npy raw;
    char err[256];
    attnd_err rv;
    if ((rv = attnd_npy_read(path, &raw, err, sizeof err)) != ATTND_ERR_OK) {
        fprintf(stderr, "attnctl: attend: %s: %s\n", what, err);
        return ATTNCTL_FAILED;
    }
    if (raw.ndim != 3) {
        fprintf(stderr, "attnctl: attend: %s: %s has %d dims, expected [tokens, heads, head]\n",
                what, path, (int)raw.ndim);
        attnd_npy_free(&raw);
        return ATTNCTL_USAGE;
    }
    if (!have_dtype) *dtype = raw.dtype;
    rv = attnd_npy_convert(&raw, *dtype, out);
    attnd_npy_free(&raw);
    if (rv != ATTND_ERR_OK) {
        fprintf(stderr, "attnctl: attend: %s: cannot convert to %s\n", what,
                attnd_dtype_name(*dtype));
        return ATTNCTL_FAILED;
    }
    return ATTNCTL_OK;
}

static int load_all(attend_opts *o, attend_data *d)
{
    attnd_dtype dt = o->dtype;
    int have = o->have_dtype, rc;
    if ((rc = load_input(o->q, "q", have, &dt, &d->q)) != ATTNCTL_OK ||
        (rc = load_input(o->k, "k", 1, &dt, &d->k)) != ATTNCTL_OK ||
        (rc = load_input(o->v, "v", 1, &dt, &d->v)) != ATTNCTL_OK)
        return rc;
    o->dtype = dt;
    d->tokens = d->q.shape[0];
    if (d->k.shape[0] != d->tokens || d->v.shape[0] != d->tokens)
        return attnctl_usage_error("attend", "q, k and v have %lld, %lld, %lld rows",
                                   (long long)d->tokens, (long long)d->k.shape[0],
                                   (long long)d->v.shape[0]);
    if (attnd_npy_alloc(&d->out, dt, 3, d->q.shape) != ATTND_ERR_OK) return ATTNCTL_FAILED;
    if (o->lse != NULL) {
        int64_t shape[2] = {d->q.shape[1], d->tokens};
        if (attnd_npy_alloc(&d->lse, ATTND_DTYPE_F32, 2, shape) != ATTND_ERR_OK)
            return ATTNCTL_FAILED;
    }
    return ATTNCTL_OK;
}

static size_t align_up(size_t n)
{
    return (n + SHM_ALIGN - 1) / SHM_ALIGN * SHM_ALIGN;
}

/* References for q, k, v, out, lse: inline, or copied into one shm region. */
static int make_refs(attnctl *ctl, const attend_opts *o, attend_data *d, attnd_ref r[5])
{
    attnd_npy *arr[5] = {&d->q, &d->k, &d->v, &d->out, o->lse ? &d->lse : NULL};
    size_t off[5], total = 0;
    attnd_err rv;
    for (int i = 0; i < 5; i++) {
        off[i] = total;
        if (arr[i] != NULL) total += align_up(arr[i]->bytes);
    }
    if (!o->use_inline &&
        (rv = attnd_client_shm_create(ctl->c, total > 0 ? total : 1, &d->shm)) != ATTND_ERR_OK)
        return attnctl_fail(ctl, "attend: shm region", rv);
    for (int i = 0; i < 5; i++) {
        attnd_npy *a = arr[i];
        if (a == NULL) continue;
        if (o->use_inline && i < 3)
            attnd_ref_inline_in(&r[i], a->data, a->dtype, a->ndim, a->shape);
        else if (o->use_inline)
            attnd_ref_inline_out(&r[i], a->data, a->dtype, a->ndim, a->shape);
        else {
            attnd_ref_shm(&r[i], &d->shm, off[i], a->dtype, a->ndim, a->shape);
            if (i < 3) memcpy((char *)d->shm.base + off[i], a->data, a->bytes);
        }
    }
    return ATTNCTL_OK;
}

/* Copy shm outputs back into the arrays. */
static void fetch_outputs(const attend_opts *o, attend_data *d, const attnd_ref r[5])
{
    if (o->use_inline) return;
    memcpy(d->out.data, (char *)d->shm.base + r[3].offset, d->out.bytes);
    if (o->lse != NULL) memcpy(d->lse.data, (char *)d->shm.base + r[4].offset, d->lse.bytes);
}

/* Begin, attend every layer with the same Q/K/V (a commit needs them all; --layer last, so the
 * outputs are its), end (abort when an attend failed). */
static int run_step(attnctl *ctl, const attend_opts *o, const attnd_ref r[5], double *secs)
{
    attnd_step step;
    attnd_ref out = r[3], lse = r[4];
    attnd_err rv = ATTND_ERR_OK;
    uint32_t layers = attnd_client_server(ctl->c)->geometry.num_layers;
    double t0 = attnctl_now();
    if ((rv = attnd_client_step_begin(ctl->c, o->seqs, o->nseqs, &step, NULL)) != ATTND_ERR_OK)
        return attnctl_fail(ctl, "attend: begin_step", rv);
    for (uint32_t i = 0; i < layers && rv == ATTND_ERR_OK; i++) {
        uint32_t l = i + 1 == layers ? o->layer : i < o->layer ? i : i + 1;
        rv = attnd_client_attend(ctl->c, step.id, l, &r[0], &r[1], &r[2], &out,
                                 o->lse ? &lse : NULL);
    }
    if (rv != ATTND_ERR_OK) {
        int rc = attnctl_fail(ctl, "attend", rv);
        attnd_client_step_end(ctl->c, step.id, 1);
        return rc;
    }
    if ((rv = attnd_client_step_end(ctl->c, step.id, 0)) != ATTND_ERR_OK)
        return attnctl_fail(ctl, "attend: end_step", rv);
    *secs = attnctl_now() - t0;
    return ATTNCTL_OK;
}

/* Write an array as .npy, as f32 when its dtype has no .npy form. */
static int write_npy(const char *path, const attnd_npy *a)
{
    attnd_npy f32;
    char err[256];
    attnd_err rv;
    if (a->dtype == ATTND_DTYPE_BF16 || a->dtype == ATTND_DTYPE_FP8_E4M3) {
        if (attnd_npy_convert(a, ATTND_DTYPE_F32, &f32) != ATTND_ERR_OK) return ATTNCTL_FAILED;
        rv = attnd_npy_write(path, &f32, err, sizeof err);
        attnd_npy_free(&f32);
    } else {
        rv = attnd_npy_write(path, a, err, sizeof err);
    }
    if (rv != ATTND_ERR_OK) {
        fprintf(stderr, "attnctl: attend: %s\n", err);
        return ATTNCTL_FAILED;
    }
    return ATTNCTL_OK;
}

static void print_result(const attend_opts *o, const attend_data *d, double secs)
{
    int64_t hd = d->out.shape[2], show = hd < 6 ? hd : 6;
    printf("attend: %lld tokens in %zu sequence(s), layer %u, %s via %s: %.3f ms\n",
           (long long)d->tokens, o->nseqs, o->layer, attnd_dtype_name(o->dtype),
           o->use_inline ? "inline" : "shm", secs * 1e3);
    printf("out [%lld, %lld, %lld] -> %s\n", (long long)d->out.shape[0], (long long)d->out.shape[1],
           (long long)hd, o->out);
    for (int64_t t = 0; t < d->tokens && t < 4; t++) {
        printf("  out[%lld, 0, :%lld] =", (long long)t, (long long)show);
        for (int64_t i = 0; i < show; i++)
            printf(" %+.5f",
                   (double)attnd_load_f32(d->out.data, d->out.dtype, t * d->out.shape[1] * hd + i));
        printf("%s\n", show < hd ? " ..." : "");
    }
    if (d->tokens > 4) printf("  ... (%lld more rows)\n", (long long)(d->tokens - 4));
}

int attnctl_cmd_attend(attnctl *ctl, int argc, char **argv)
{
    attend_opts o;
    attend_data d;
    attnd_ref r[5];
    uint64_t temp = 0;
    double secs = 0;
    int rc;
    memset(&d, 0, sizeof d);
    memset(r, 0, sizeof r);
    if ((rc = parse_opts(argc, argv, &o)) != ATTNCTL_OK || ctl->check_only) return rc;
    if ((rc = attnctl_session(ctl)) != ATTNCTL_OK) return rc;
    if ((rc = load_all(&o, &d)) != ATTNCTL_OK) goto out;
    if (o.nseqs == 0) {
        attnd_err rv;
        temp = 0x7e570000000000ull | (uint64_t)getpid();
        if ((rv = attnd_client_seq_create(ctl->c, temp, NULL)) != ATTND_ERR_OK) {
            temp = 0;
            rc = attnctl_fail(ctl, "attend: create", rv);
            goto out;
        }
        o.seqs[0].seq_id = temp;
        o.seqs[0].new_tokens = (uint32_t)d.tokens;
        o.nseqs = 1;
    }
    if ((rc = make_refs(ctl, &o, &d, r)) != ATTNCTL_OK) goto out;
    if ((rc = run_step(ctl, &o, r, &secs)) != ATTNCTL_OK) goto out;
    fetch_outputs(&o, &d, r);
    if ((rc = write_npy(o.out, &d.out)) != ATTNCTL_OK) goto out;
    if (o.lse != NULL && (rc = write_npy(o.lse, &d.lse)) != ATTNCTL_OK) goto out;
    print_result(&o, &d, secs);
out:
    if (temp != 0) attnd_client_seq_free(ctl->c, temp);
    data_free(&d, ctl);
    return rc;
}
