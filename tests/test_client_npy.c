/* libattnd-client's .npy reader / writer: round trips of every supported dtype and shape, files
 * as NumPy writes them (versions 1.0 and 2.0), every rejection with its code, conversion. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attnd/npy.h"

/* A fresh temporary path (removed by the caller). */
static void tmp_path(char *buf, size_t n)
{
    snprintf(buf, n, "/tmp/attnd-npy-%ld-XXXXXX", (long)getpid());
    int fd = mkstemp(buf);
    cr_assert_geq(fd, 0);
    close(fd);
}

static void write_bytes(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

static void round_trip(attnd_dtype dt, int32_t ndim, const int64_t *shape)
{
    char path[64], err[256];
    attnd_npy a, b;
    cr_assert_eq(attnd_npy_alloc(&a, dt, ndim, shape), ATTND_ERR_OK);
    for (size_t i = 0; i < a.bytes; i++)
        ((unsigned char *)a.data)[i] = (unsigned char)(i * 37 + 5);
    tmp_path(path, sizeof path);
    cr_assert_eq(attnd_npy_write(path, &a, err, sizeof err), ATTND_ERR_OK, "%s", err);
    cr_assert_eq(attnd_npy_read(path, &b, err, sizeof err), ATTND_ERR_OK, "%s", err);
    cr_assert_eq(b.dtype, dt);
    cr_assert_eq(b.ndim, ndim);
    for (int32_t d = 0; d < ndim; d++)
        cr_assert_eq(b.shape[d], shape[d]);
    cr_assert_eq(b.bytes, a.bytes);
    cr_assert_eq(memcmp(a.data, b.data, a.bytes), 0);
    attnd_npy_free(&a);
    attnd_npy_free(&b);
    unlink(path);
}

Test(client_npy, round_trip_every_dtype_and_shape, .timeout = 30)
{
    const attnd_dtype dts[] = {ATTND_DTYPE_F32, ATTND_DTYPE_F16, ATTND_DTYPE_I32, ATTND_DTYPE_I64};
    const int64_t s3[] = {2, 3, 4}, s1[] = {5}, s0[] = {0, 3}, s4[] = {3, 1, 2, 7};
    for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
        round_trip(dts[i], 0, NULL); /* a scalar */
        round_trip(dts[i], 1, s1);
        round_trip(dts[i], 3, s3);
        round_trip(dts[i], 2, s0); /* no elements */
        round_trip(dts[i], 4, s4);
    }
}

Test(client_npy, header_is_numpy_aligned, .timeout = 30)
{
    char path[64], err[256];
    unsigned char buf[256];
    attnd_npy a;
    const int64_t shape[] = {7, 3};
    cr_assert_eq(attnd_npy_alloc(&a, ATTND_DTYPE_F32, 2, shape), ATTND_ERR_OK);
    tmp_path(path, sizeof path);
    cr_assert_eq(attnd_npy_write(path, &a, err, sizeof err), ATTND_ERR_OK);
    FILE *f = fopen(path, "rb");
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    unsigned hlen = buf[8] | (unsigned)buf[9] << 8;
    cr_assert_eq(memcmp(buf, "\x93NUMPY\x01\x00", 8), 0);
    cr_assert_eq((10 + hlen) % 64, 0, "data offset %u not 64-aligned", 10 + hlen);
    cr_assert_eq(buf[10 + hlen - 1], '\n');
    cr_assert_eq(n, 10 + hlen + 7 * 3 * 4);
    buf[10 + hlen] = '\0';
    cr_assert_not_null(strstr((char *)buf + 10, "'descr': '<f4'"));
    cr_assert_not_null(strstr((char *)buf + 10, "'fortran_order': False"));
    cr_assert_not_null(strstr((char *)buf + 10, "'shape': (7, 3)"));
    attnd_npy_free(&a);
    unlink(path);
}

/* Bytes exactly as numpy.save writes np.arange(3, dtype='<f4') (version 1.0). */
static size_t numpy_v1_f32(unsigned char *buf)
{
    const char *hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }";
    size_t h = strlen(hdr), hlen = 118; /* 10 + 118 = 128 */
    float vals[3] = {0.0f, 1.0f, 2.0f};
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (unsigned char)hlen;
    buf[9] = 0;
    memcpy(buf + 10, hdr, h);
    memset(buf + 10 + h, ' ', hlen - h - 1);
    buf[10 + hlen - 1] = '\n';
    memcpy(buf + 10 + hlen, vals, sizeof vals);
    return 10 + hlen + sizeof vals;
}

Test(client_npy, reads_numpy_files, .timeout = 30)
{
    unsigned char buf[512];
    char path[64], err[256];
    attnd_npy a;
    size_t n = numpy_v1_f32(buf);
    tmp_path(path, sizeof path);
    write_bytes(path, buf, n);
    cr_assert_eq(attnd_npy_read(path, &a, err, sizeof err), ATTND_ERR_OK, "%s", err);
    cr_assert_eq(a.dtype, ATTND_DTYPE_F32);
    cr_assert_eq(a.ndim, 1);
    cr_assert_eq(a.shape[0], 3);
    cr_assert_eq(((float *)a.data)[2], 2.0f);
    attnd_npy_free(&a);

    /* version 2.0: the same dict behind a 4-byte header length */
    unsigned char v2[512];
    memcpy(v2, "\x93NUMPY\x02\x00", 8);
    v2[8] = 118;
    v2[9] = v2[10] = v2[11] = 0;
    memcpy(v2 + 12, buf + 10, n - 10);
    write_bytes(path, v2, 12 + (n - 10));
    cr_assert_eq(attnd_npy_read(path, &a, err, sizeof err), ATTND_ERR_OK, "%s", err);
    cr_assert_eq(a.shape[0], 3);
    cr_assert_eq(((float *)a.data)[1], 1.0f);
    attnd_npy_free(&a);
    unlink(path);
}

/* A numpy v1 file with its dict replaced (same length budget). */
static void write_with_dict(const char *path, const char *dict, size_t data_bytes)
{
    unsigned char buf[512];
    size_t h = strlen(dict), hlen = 118;
    memset(buf, 0, sizeof buf);
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (unsigned char)hlen;
    memcpy(buf + 10, dict, h);
    memset(buf + 10 + h, ' ', hlen - h - 1);
    buf[10 + hlen - 1] = '\n';
    write_bytes(path, buf, 10 + hlen + data_bytes);
}

static void expect_read(const char *path, attnd_err want)
{
    char err[256] = "";
    attnd_npy a;
    attnd_err rv = attnd_npy_read(path, &a, err, sizeof err);
    cr_assert_eq(rv, want, "%s: got %s (%s)", path, attnd_err_name(rv), err);
    cr_assert_null(a.data);
    cr_assert_not_null(strstr(err, path), "message '%s' does not name the file", err);
}

Test(client_npy, rejects_bad_files_with_their_codes, .timeout = 30)
{
    char path[64];
    tmp_path(path, sizeof path);
    write_bytes(path, "PK\x03\x04 not numpy at all", 22);
    expect_read(path, ATTND_ERR_INVALID_ARGUMENT);
    write_bytes(path, "\x93NUMPY\x01", 7);
    expect_read(path, ATTND_ERR_INVALID_ARGUMENT);
    write_with_dict(path, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", 8);
    expect_read(path, ATTND_ERR_INVALID_ARGUMENT); /* 8 of 12 data bytes */
    write_with_dict(path, "{'descr': '>f4', 'fortran_order': False, 'shape': (3,), }", 12);
    expect_read(path, ATTND_ERR_UNSUPPORTED);
    write_with_dict(path, "{'descr': '<c8', 'fortran_order': False, 'shape': (3,), }", 24);
    expect_read(path, ATTND_ERR_UNSUPPORTED);
    write_with_dict(path, "{'descr': '<f4', 'fortran_order': True, 'shape': (3,), }", 12);
    expect_read(path, ATTND_ERR_UNSUPPORTED);
    write_with_dict(path, "{'descr': '<f4', 'fortran_order': False, 'shape': (-3,), }", 12);
    expect_read(path, ATTND_ERR_INVALID_ARGUMENT);
    write_with_dict(path, "{'descr': '<f4', 'fortran_order': False}", 12);
    expect_read(path, ATTND_ERR_INVALID_ARGUMENT);
    unlink(path);
    expect_read(path, ATTND_ERR_NOT_FOUND);
}

Test(client_npy, writes_only_numpy_dtypes, .timeout = 30)
{
    char path[64], err[256] = "";
    attnd_npy a;
    const int64_t shape[] = {4};
    cr_assert_eq(attnd_npy_alloc(&a, ATTND_DTYPE_BF16, 1, shape), ATTND_ERR_OK);
    tmp_path(path, sizeof path);
    cr_assert_eq(attnd_npy_write(path, &a, err, sizeof err), ATTND_ERR_UNSUPPORTED);
    cr_assert_not_null(strstr(err, "bf16"), "%s", err);
    attnd_npy_free(&a);
    cr_assert_eq(attnd_npy_alloc(&a, ATTND_DTYPE_COUNT, 1, shape), ATTND_ERR_INVALID_ARGUMENT);
    const int64_t neg[] = {-1};
    cr_assert_eq(attnd_npy_alloc(&a, ATTND_DTYPE_F32, 1, neg), ATTND_ERR_INVALID_ARGUMENT);
    cr_assert_eq(attnd_npy_write("/nonexistent-dir/x.npy", &(attnd_npy){.dtype = ATTND_DTYPE_F32},
                                 err, sizeof err),
                 ATTND_ERR_INTERNAL);
    unlink(path);
}

Test(client_npy, convert_rounds_like_dtype_h, .timeout = 30)
{
    attnd_npy a, b, c;
    const int64_t shape[] = {5};
    const float vals[5] = {1.0f, -2.5f, 3.14159265f, 1e-3f, 65504.0f};
    cr_assert_eq(attnd_npy_alloc(&a, ATTND_DTYPE_F32, 1, shape), ATTND_ERR_OK);
    memcpy(a.data, vals, sizeof vals);
    cr_assert_eq(attnd_npy_convert(&a, ATTND_DTYPE_BF16, &b), ATTND_ERR_OK);
    cr_assert_eq(b.bytes, 10);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(((uint16_t *)b.data)[i], attnd_f32_to_bf16(vals[i]));
    cr_assert_eq(attnd_npy_convert(&b, ATTND_DTYPE_F16, &c), ATTND_ERR_OK);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(((uint16_t *)c.data)[i],
                     attnd_f32_to_f16(attnd_bf16_to_f32(((uint16_t *)b.data)[i])));
    attnd_npy_free(&c);
    cr_assert_eq(attnd_npy_convert(&a, ATTND_DTYPE_I32, &c), ATTND_ERR_OK);
    cr_assert_eq(((int32_t *)c.data)[1], -3); /* integers: nearest, halves away from zero */
    cr_assert_eq(((int32_t *)c.data)[2], 3);
    attnd_npy_free(&a);
    attnd_npy_free(&b);
    attnd_npy_free(&c);
}
