/* kernels.h "streams": dispatch to the backend that owns b (cpu/stream.c emulates streams with
 * threads; cuda/stream.cu has CUDA streams and the driver's stream memory operations). */
#include <stdio.h>

#include "../cpu/cpu.h"
#include "stream_impl.h"

static int is_cpu(const attnd_backend *b)
{
    return b != NULL && b->ops == &attnd_cpu_backend_ops;
}

/* `return call` when b is the cuda backend (compiled in). */
#ifdef ATTND_HAVE_CUDA
#define IF_CUDA(b, call)                                                                           \
    if ((b) != NULL && (b)->ops == &attnd_cuda_backend_ops) return call
#else
#define IF_CUDA(b, call)
#endif

static attnd_err no_streams(attnd_backend *b)
{
    if (b != NULL)
        snprintf(b->last_error, sizeof b->last_error, "streams: not available on backend %s",
                 b->ops->name);
    return ATTND_ERR_UNSUPPORTED;
}

attnd_err attnd_stream_create(attnd_backend *b, attnd_stream **s)
{
    *s = NULL;
    if (is_cpu(b)) return attnd_cpu_stream_create(b, s);
    IF_CUDA(b, attnd_cuda_stream_create(b, s));
    return no_streams(b);
}

void attnd_stream_destroy(attnd_backend *b, attnd_stream *s)
{
    if (s == NULL) return;
    if (is_cpu(b)) attnd_cpu_stream_destroy(b, s);
#ifdef ATTND_HAVE_CUDA
    if (b != NULL && b->ops == &attnd_cuda_backend_ops) attnd_cuda_stream_destroy(b, s);
#endif
}

attnd_err attnd_stream_select(attnd_backend *b, attnd_stream *s)
{
    if (is_cpu(b)) return attnd_cpu_stream_select(b, s);
    IF_CUDA(b, attnd_cuda_stream_select(b, s));
    return no_streams(b);
}

attnd_err attnd_stream_wait_value(attnd_backend *b, attnd_stream *s, uint32_t *flag, uint32_t value)
{
    if (is_cpu(b)) return attnd_cpu_stream_value(s, 0, flag, 1, value);
    IF_CUDA(b, attnd_cuda_stream_value(b, s, 0, flag, 1, value));
    return no_streams(b);
}

attnd_err attnd_stream_write_values(attnd_backend *b, attnd_stream *s, uint32_t *flag,
                                    uint32_t count, uint32_t value)
{
    if (is_cpu(b)) return attnd_cpu_stream_value(s, 1, flag, count, value);
    IF_CUDA(b, attnd_cuda_stream_value(b, s, 1, flag, count, value));
    return no_streams(b);
}

attnd_err attnd_stream_write_value(attnd_backend *b, attnd_stream *s, uint32_t *flag,
                                   uint32_t value)
{
    return attnd_stream_write_values(b, s, flag, 1, value);
}

attnd_err attnd_stream_after_backend(attnd_backend *b, attnd_stream *s)
{
    (void)s;
    if (is_cpu(b)) return ATTND_ERR_OK; /* the cpu backend's own ops ran when called */
    IF_CUDA(b, attnd_cuda_stream_after_backend(b, s));
    return no_streams(b);
}

attnd_err attnd_stream_release(attnd_backend *b, uint32_t *flag, uint32_t value)
{
    if (is_cpu(b)) {
        __atomic_store_n(flag, value, __ATOMIC_RELEASE);
        return ATTND_ERR_OK;
    }
    IF_CUDA(b, attnd_cuda_stream_release(b, flag, value));
    return no_streams(b);
}

attnd_err attnd_stream_query(attnd_backend *b, attnd_stream *s)
{
    if (is_cpu(b)) return attnd_cpu_stream_query(b, s);
    IF_CUDA(b, attnd_cuda_stream_query(b, s));
    return no_streams(b);
}

uint32_t attnd_stream_collect(attnd_backend *b)
{
#ifdef ATTND_HAVE_CUDA
    if (b != NULL && b->ops == &attnd_cuda_backend_ops) return attnd_cuda_collect(b, 0);
#endif
    (void)b;
    return 0;
}
