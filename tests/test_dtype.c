/* Conversions: bf16, fp16 and fp8-e4m3fn round trips, rounding, saturation, NaN; error names. */
#include <criterion/criterion.h>
#include <math.h>

#include "attnd/kernels.h"

Test(dtype, fp8_every_code_round_trips)
{
    for (int c = 0; c < 256; c++) {
        float f = attnd_fp8_to_f32((uint8_t)c);
        if ((c & 0x7f) == 0x7f) {
            cr_assert(isnan(f), "code 0x%02x should be NaN", c);
            continue;
        }
        uint8_t back = attnd_f32_to_fp8(f);
        /* -0 and +0 are distinct codes that both read as zero */
        cr_assert_eq(back, (uint8_t)c, "code 0x%02x -> %g -> 0x%02x", c, f, back);
    }
}

Test(dtype, fp8_saturates_and_rounds)
{
    cr_assert_eq(attnd_fp8_to_f32(attnd_f32_to_fp8(448.0f)), 448.0f);
    cr_assert_eq(attnd_fp8_to_f32(attnd_f32_to_fp8(1e6f)), 448.0f);
    cr_assert_eq(attnd_fp8_to_f32(attnd_f32_to_fp8(-1e6f)), -448.0f);
    cr_assert_eq(attnd_fp8_to_f32(attnd_f32_to_fp8(INFINITY)), 448.0f);
    cr_assert(isnan(attnd_fp8_to_f32(attnd_f32_to_fp8(NAN))));
    /* 1.0625 is halfway between 1.0 and 1.125: ties to even (1.0) */
    cr_assert_eq(attnd_fp8_to_f32(attnd_f32_to_fp8(1.0625f)), 1.0f);
    cr_assert_eq(attnd_fp8_to_f32(attnd_f32_to_fp8(1.1875f)), 1.25f);
    /* smallest subnormal 2^-9; half of it ties to zero */
    cr_assert_eq(attnd_fp8_to_f32(attnd_f32_to_fp8(0.001953125f)), 0.001953125f);
    cr_assert_eq(attnd_fp8_to_f32(attnd_f32_to_fp8(0.0009765625f)), 0.0f);
}

Test(dtype, bf16_and_f16_round_trip)
{
    for (uint32_t c = 0; c < 65536; c++) {
        float f = attnd_bf16_to_f32((uint16_t)c);
        if (isnan(f))
            cr_assert(isnan(attnd_bf16_to_f32(attnd_f32_to_bf16(f))));
        else
            cr_assert_eq(attnd_f32_to_bf16(f), (uint16_t)c, "bf16 0x%04x", c);
        float h = attnd_f16_to_f32((uint16_t)c);
        if (isnan(h))
            cr_assert(isnan(attnd_f16_to_f32(attnd_f32_to_f16(h))));
        else
            cr_assert_eq(attnd_f32_to_f16(h), (uint16_t)c, "f16 0x%04x", c);
    }
    cr_assert_eq(attnd_f16_to_f32(attnd_f32_to_f16(70000.0f)), INFINITY);
    cr_assert_eq(attnd_f16_to_f32(attnd_f32_to_f16(65504.0f)), 65504.0f);
    /* bf16 ties to even: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 */
    cr_assert_eq(attnd_bf16_to_f32(attnd_f32_to_bf16(1.00390625f)), 1.0f);
}

Test(dtype, names_parse_back)
{
    for (int i = 0; i < ATTND_DTYPE_COUNT; i++) {
        attnd_dtype dt;
        cr_assert_eq(attnd_dtype_parse(attnd_dtype_name((attnd_dtype)i), &dt), 0);
        cr_assert_eq(dt, (attnd_dtype)i);
    }
    attnd_dtype dt;
    cr_assert_eq(attnd_dtype_parse("float99", &dt), -1);
    cr_assert_str_eq(attnd_err_name(ATTND_ERR_OUT_OF_BLOCKS), "OUT_OF_BLOCKS");
    cr_assert_str_eq(attnd_strerror(ATTND_ERR_OK), "ok");
}
