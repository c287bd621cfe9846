/* .npy read / write / convert (attnd/npy.h): part of libattnd-client, written for attnctl. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnd/npy.h"

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6
#define NPY_ALIGN 64
#define NPY_MAX_HEADER (1u << 20)

int64_t attnd_npy_numel(const attnd_npy *arr)
{
    int64_t n = 1;
    for (int32_t d = 0; d < arr->ndim; d++)
        n *= arr->shape[d];
    return n;
}

/* Bytes of a dtype/shape, 0 when invalid or overflowing. */
static size_t npy_nbytes(attnd_dtype dtype, int32_t ndim, const int64_t *shape)
{
    size_t n = attnd_dtype_size(dtype);
    if (ndim < 0 || ndim > ATTND_NPY_MAX_DIMS || n == 0) return 0;
    for (int32_t d = 0; d < ndim; d++) {
        if (shape[d] < 0) return 0;
        if (shape[d] != 0 && n > SIZE_MAX / (size_t)shape[d]) return 0;
        n *= (size_t)shape[d];
    }
    return n;
}

attnd_err attnd_npy_alloc(attnd_npy *arr, attnd_dtype dtype, int32_t ndim, const int64_t *shape)
{
    size_t bytes;
    int64_t numel = 1;
    memset(arr, 0, sizeof *arr);
    if (attnd_dtype_size(dtype) == 0 || ndim < 0 || ndim > ATTND_NPY_MAX_DIMS)
        return ATTND_ERR_INVALID_ARGUMENT;
    for (int32_t d = 0; d < ndim; d++) {
        if (shape[d] < 0) return ATTND_ERR_INVALID_ARGUMENT;
        numel = shape[d] == 0 ? 0 : numel;
    }
    bytes = npy_nbytes(dtype, ndim, shape);
    if (bytes == 0 && numel != 0) return ATTND_ERR_INVALID_ARGUMENT; /* overflow */
    arr->data = calloc(1, bytes > 0 ? bytes : 1);
    if (arr->data == NULL) return ATTND_ERR_NO_MEMORY;
    arr->dtype = dtype;
    arr->ndim = ndim;
    for (int32_t d = 0; d < ndim; d++)
        arr->shape[d] = shape[d];
    arr->bytes = bytes;
    return ATTND_ERR_OK;
}

void attnd_npy_free(attnd_npy *arr)
{
    free(arr->data);
    memset(arr, 0, sizeof *arr);
}

/* ---------------------------------------------------------------- header */

static const struct {
    const char *descr;
    attnd_dtype dtype;
} npy_types[] = {
    {"f4", ATTND_DTYPE_F32},
    {"f2", ATTND_DTYPE_F16},
    {"i4", ATTND_DTYPE_I32},
    {"i8", ATTND_DTYPE_I64},
};

static const char *descr_of(attnd_dtype dt)
{
    for (size_t i = 0; i < sizeof npy_types / sizeof npy_types[0]; i++)
        if (npy_types[i].dtype == dt) return npy_types[i].descr;
    return NULL;
}

/* The value after key `name` in the header dict, or NULL. */
static const char *dict_value(const char *hdr, const char *name)
{
    char key[32];
    const char *p;
    snprintf(key, sizeof key, "'%s'", name);
    if ((p = strstr(hdr, key)) == NULL) {
        snprintf(key, sizeof key, "\"%s\"", name);
        if ((p = strstr(hdr, key)) == NULL) return NULL;
    }
    p += strlen(key);
    while (*p == ' ')
        p++;
    if (*p != ':') return NULL;
    p++;
    while (*p == ' ')
        p++;
    return p;
}

static attnd_err parse_descr(const char *hdr, attnd_dtype *dt, char *err, size_t errlen,
                             const char *path)
{
    const char *v = dict_value(hdr, "descr");
    char d[16] = {0};
    size_t n = 0;
    if (v == NULL || (*v != '\'' && *v != '"'))
        return attnd_errf(err, errlen, ATTND_ERR_INVALID_ARGUMENT, "%s: header has no descr", path);
    for (v++; *v && *v != '\'' && *v != '"' && n < sizeof d - 1;)
        d[n++] = *v++;
    /* byte order: '<' little, '=' native (little here), '|' not applicable (1-byte types) */
    if (n == 3 && (d[0] == '<' || d[0] == '=' || d[0] == '|')) {
        for (size_t i = 0; i < sizeof npy_types / sizeof npy_types[0]; i++) {
            if (strcmp(d + 1, npy_types[i].descr) == 0) {
                *dt = npy_types[i].dtype;
                return ATTND_ERR_OK;
            }
        }
    }
    return attnd_errf(err, errlen, ATTND_ERR_UNSUPPORTED,
                      "%s: dtype '%s' unsupported (little-endian f4, f2, i4, i8)", path, d);
}

static attnd_err parse_shape(const char *hdr, attnd_npy *arr, char *err, size_t errlen,
                             const char *path)
{
    const char *v = dict_value(hdr, "shape");
    char *end;
    if (v == NULL || *v != '(')
        return attnd_errf(err, errlen, ATTND_ERR_INVALID_ARGUMENT, "%s: header has no shape", path);
    v++;
    arr->ndim = 0;
    for (;;) {
        while (*v == ' ' || *v == ',')
            v++;
        if (*v == ')') return ATTND_ERR_OK;
        if (arr->ndim == ATTND_NPY_MAX_DIMS)
            return attnd_errf(err, errlen, ATTND_ERR_UNSUPPORTED, "%s: more than %d dims", path,
                              ATTND_NPY_MAX_DIMS);
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (end == v || errno != 0 || x < 0)
            return attnd_errf(err, errlen, ATTND_ERR_INVALID_ARGUMENT,
                              "%s: bad shape entry '%.16s'", path, v);
        arr->shape[arr->ndim++] = x;
        v = end;
        while (*v == 'L')
            v++; /* Python 2 longs */
    }
}

static attnd_err parse_header(const char *hdr, attnd_npy *arr, char *err, size_t errlen,
                              const char *path)
{
    const char *fo = dict_value(hdr, "fortran_order");
    attnd_err rv;
    if ((rv = parse_descr(hdr, &arr->dtype, err, errlen, path)) != ATTND_ERR_OK) return rv;
    if (fo == NULL)
        return attnd_errf(err, errlen, ATTND_ERR_INVALID_ARGUMENT,
                          "%s: header has no fortran_order", path);
    if (strncmp(fo, "False", 5) != 0)
        return attnd_errf(err, errlen, ATTND_ERR_UNSUPPORTED,
                          "%s: fortran_order arrays unsupported", path);
    return parse_shape(hdr, arr, err, errlen, path);
}

/* Magic, version and header length; leaves f at the header dict. */
static attnd_err read_preamble(FILE *f, uint32_t *hlen, char *err, size_t errlen, const char *path)
{
    unsigned char pre[NPY_MAGIC_LEN + 2], len[4] = {0};
    size_t lenbytes;
    if (fread(pre, 1, sizeof pre, f) != sizeof pre || memcmp(pre, NPY_MAGIC, NPY_MAGIC_LEN) != 0)
        return attnd_errf(err, errlen, ATTND_ERR_INVALID_ARGUMENT, "%s: not a .npy file", path);
    if (pre[NPY_MAGIC_LEN] < 1 || pre[NPY_MAGIC_LEN] > 3)
        return attnd_errf(err, errlen, ATTND_ERR_UNSUPPORTED, "%s: .npy version %u.%u unsupported",
                          path, pre[NPY_MAGIC_LEN], pre[NPY_MAGIC_LEN + 1]);
    lenbytes = pre[NPY_MAGIC_LEN] == 1 ? 2 : 4;
    if (fread(len, 1, lenbytes, f) != lenbytes)
        return attnd_errf(err, errlen, ATTND_ERR_INVALID_ARGUMENT, "%s: truncated header", path);
    *hlen =
        (uint32_t)len[0] | (uint32_t)len[1] << 8 | (uint32_t)len[2] << 16 | (uint32_t)len[3] << 24;
    if (*hlen == 0 || *hlen > NPY_MAX_HEADER)
        return attnd_errf(err, errlen, ATTND_ERR_INVALID_ARGUMENT, "%s: header length %u", path,
                          *hlen);
    return ATTND_ERR_OK;
}

static attnd_err read_file(FILE *f, attnd_npy *arr, char *err, size_t errlen, const char *path)
{
    uint32_t hlen = 0;
    char *hdr;
    attnd_npy meta;
    attnd_err rv;
    memset(&meta, 0, sizeof meta);
    if ((rv = read_preamble(f, &hlen, err, errlen, path)) != ATTND_ERR_OK) return rv;
    if ((hdr = calloc(1, (size_t)hlen + 1)) == NULL) return ATTND_ERR_NO_MEMORY;
    if (fread(hdr, 1, hlen, f) != hlen)
        rv = attnd_errf(err, errlen, ATTND_ERR_INVALID_ARGUMENT, "%s: truncated header", path);
    else
        rv = parse_header(hdr, &meta, err, errlen, path);
    free(hdr);
    if (rv != ATTND_ERR_OK) return rv;
    if (npy_nbytes(meta.dtype, meta.ndim, meta.shape) == 0 && attnd_npy_numel(&meta) != 0)
        return attnd_errf(err, errlen, ATTND_ERR_INVALID_ARGUMENT, "%s: shape too large", path);
    if ((rv = attnd_npy_alloc(arr, meta.dtype, meta.ndim, meta.shape)) != ATTND_ERR_OK)
        return attnd_errf(err, errlen, rv, "%s: cannot allocate the data", path);
    if (fread(arr->data, 1, arr->bytes, f) != arr->bytes) {
        attnd_npy_free(arr);
        return attnd_errf(err, errlen, ATTND_ERR_INVALID_ARGUMENT,
                          "%s: truncated data (shorter than its shape)", path);
    }
    return ATTND_ERR_OK;
}

attnd_err attnd_npy_read(const char *path, attnd_npy *arr, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    attnd_err rv;
    memset(arr, 0, sizeof *arr);
    if (f == NULL)
        return attnd_errf(err, errlen, ATTND_ERR_NOT_FOUND, "%s: %s", path, strerror(errno));
    rv = read_file(f, arr, err, errlen, path);
    fclose(f);
    return rv;
}

/* The header dict padded with spaces to a multiple of NPY_ALIGN (with the preamble), ending
 * in '\n'. Returns its length, 0 when it does not fit. */
static size_t format_header(const attnd_npy *arr, const char *descr, char *buf, size_t cap)
{
    size_t n =
        (size_t)snprintf(buf, cap, "{'descr': '<%s', 'fortran_order': False, 'shape': (", descr);
    for (int32_t d = 0; d < arr->ndim && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, "%lld%s", (long long)arr->shape[d],
                              arr->ndim == 1      ? ","
                              : d + 1 < arr->ndim ? ", "
                                                  : "");
    if (n < cap) n += (size_t)snprintf(buf + n, cap - n, "), }");
    size_t total = (NPY_MAGIC_LEN + 4 + n + 1 + NPY_ALIGN - 1) / NPY_ALIGN * NPY_ALIGN;
    size_t hlen = total - NPY_MAGIC_LEN - 4;
    if (hlen + 1 > cap) return 0;
    memset(buf + n, ' ', hlen - n - 1);
    buf[hlen - 1] = '\n';
    buf[hlen] = '\0';
    return hlen;
}

attnd_err attnd_npy_write(const char *path, const attnd_npy *arr, char *err, size_t errlen)
{
    const char *descr = descr_of(arr->dtype);
    char hdr[512];
    unsigned char pre[NPY_MAGIC_LEN + 4] = NPY_MAGIC "\x01";
    size_t hlen;
    FILE *f;
    int ok;
    if (descr == NULL)
        return attnd_errf(err, errlen, ATTND_ERR_UNSUPPORTED, "%s: dtype %s has no .npy form", path,
                          attnd_dtype_name(arr->dtype));
    if ((hlen = format_header(arr, descr, hdr, sizeof hdr)) == 0)
        return attnd_errf(err, errlen, ATTND_ERR_INVALID_ARGUMENT, "%s: header too long", path);
    pre[NPY_MAGIC_LEN + 1] = 0;
    pre[NPY_MAGIC_LEN + 2] = (unsigned char)(hlen & 0xff);
    pre[NPY_MAGIC_LEN + 3] = (unsigned char)(hlen >> 8);
    if ((f = fopen(path, "wb")) == NULL)
        return attnd_errf(err, errlen, ATTND_ERR_INTERNAL, "%s: %s", path, strerror(errno));
    ok = fwrite(pre, 1, sizeof pre, f) == sizeof pre && fwrite(hdr, 1, hlen, f) == hlen &&
         (arr->bytes == 0 || fwrite(arr->data, 1, arr->bytes, f) == arr->bytes);
    if (fclose(f) != 0) ok = 0;
    if (!ok) return attnd_errf(err, errlen, ATTND_ERR_INTERNAL, "%s: write failed", path);
    return ATTND_ERR_OK;
}

/* ---------------------------------------------------------------- conversion */

static int is_int(attnd_dtype dt)
{
    return dt == ATTND_DTYPE_I32 || dt == ATTND_DTYPE_I64;
}

static double load_f64(const void *base, attnd_dtype dt, int64_t i)
{
    if (dt == ATTND_DTYPE_I64) return (double)((const int64_t *)base)[i];
    return (double)attnd_load_f32(base, dt, i);
}

static void store_f64(void *base, attnd_dtype dt, int64_t i, double v)
{
    if (dt == ATTND_DTYPE_I32)
        ((int32_t *)base)[i] = (int32_t)llround(v);
    else if (dt == ATTND_DTYPE_I64)
        ((int64_t *)base)[i] = (int64_t)llround(v);
    else
        attnd_store_f32(base, dt, i, (float)v);
}

attnd_err attnd_npy_convert(const attnd_npy *src, attnd_dtype dtype, attnd_npy *dst)
{
    attnd_err rv;
    int64_t n = attnd_npy_numel(src);
    if ((rv = attnd_npy_alloc(dst, dtype, src->ndim, src->shape)) != ATTND_ERR_OK) return rv;
    if (src->dtype == dtype) {
        memcpy(dst->data, src->data, dst->bytes);
        return ATTND_ERR_OK;
    }
    if (is_int(src->dtype) && is_int(dtype)) {
        for (int64_t i = 0; i < n; i++)
            store_f64(dst->data, dtype, i,
                      src->dtype == ATTND_DTYPE_I32 ? ((const int32_t *)src->data)[i]
                                                    : (double)((const int64_t *)src->data)[i]);
        return ATTND_ERR_OK;
    }
    for (int64_t i = 0; i < n; i++)
        store_f64(dst->data, dtype, i, load_f64(src->data, src->dtype, i));
    return ATTND_ERR_OK;
}
