/* The cuda backend's streams (cuda/stream.cu), called by common/stream.c. */
#ifndef ATTND_KERNELS_STREAM_IMPL_H
#define ATTND_KERNELS_STREAM_IMPL_H

#include "attnd/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef ATTND_HAVE_CUDA
attnd_err attnd_cuda_stream_create(attnd_backend *b, attnd_stream **s);
void attnd_cuda_stream_destroy(attnd_backend *b, attnd_stream *s);
attnd_err attnd_cuda_stream_select(attnd_backend *b, attnd_stream *s);
/* Queue a wait for (write 0) value at flag, or a write (write 1) of value to count words. */
attnd_err attnd_cuda_stream_value(attnd_backend *b, attnd_stream *s, int write, uint32_t *flag,
                                  uint32_t count, uint32_t value);
attnd_err attnd_cuda_stream_after_backend(attnd_backend *b, attnd_stream *s);
attnd_err attnd_cuda_stream_release(attnd_backend *b, uint32_t *flag, uint32_t value);
attnd_err attnd_cuda_stream_query(attnd_backend *b, attnd_stream *s);
uint32_t attnd_cuda_collect(attnd_backend *b, int force);
#endif

#ifdef __cplusplus
}
#endif
#endif
