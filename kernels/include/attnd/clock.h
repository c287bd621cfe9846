/* The one monotonic clock of the daemon, the client and the tools (CLOCK_MONOTONIC). */
#ifndef ATTND_CLOCK_H
#define ATTND_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t attnd_clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t attnd_clock_ms(void) { return attnd_clock_ns() / 1000000ull; }

#endif
