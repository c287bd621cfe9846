/* Protobuf wire-format bytes for the tests that hand-make messages (hostile sizes the
 * generated packer would never write). */
#ifndef ATTND_TESTS_PBWIRE_H
#define ATTND_TESTS_PBWIRE_H

#include <stddef.h>
#include <stdint.h>

/* v as a base-128 varint at p (at most 10 bytes); returns the bytes written. */
static inline size_t attnd_pb_put_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    do {
        p[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    return n;
}

#endif
