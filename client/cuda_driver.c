#include "cuda_driver.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

/* The driver's versioned symbols (the ones cuda.h maps the plain names to since CUDA 12). */
typedef struct sym {
    const char *name;
    size_t off;
} sym;

#define SYM(field, name)                                                                           \
    {                                                                                              \
        name, offsetof(attnd_cu_driver, field)                                                     \
    }

static const sym syms[] = {
    SYM(ctx_get_current, "cuCtxGetCurrent"),
    SYM(ctx_set_current, "cuCtxSetCurrent"),
    SYM(ctx_get_device, "cuCtxGetDevice"),
    SYM(mem_alloc, "cuMemAlloc_v2"),
    SYM(mem_free, "cuMemFree_v2"),
    SYM(memset_d32, "cuMemsetD32_v2"),
    SYM(memcpy_dtod_async, "cuMemcpyDtoDAsync_v2"),
    SYM(ipc_get, "cuIpcGetMemHandle"),
    SYM(ipc_open, "cuIpcOpenMemHandle_v2"),
    SYM(ipc_close, "cuIpcCloseMemHandle"),
    SYM(wait32, "cuStreamWaitValue32_v2"),
    SYM(write32, "cuStreamWriteValue32_v2"),
    SYM(stream_create, "cuStreamCreate"),
    SYM(stream_destroy, "cuStreamDestroy_v2"),
    SYM(stream_sync, "cuStreamSynchronize"),
    SYM(error_string, "cuGetErrorString"),
    SYM(mem_range, "cuMemGetAddressRange_v2"),
    SYM(pointer_attr, "cuPointerGetAttribute"),
};

attnd_err attnd_cu_load(attnd_cu_driver *d, char *err, size_t n)
{
    memset(d, 0, sizeof *d);
    if ((d->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) == NULL)
        return attnd_errf(err, n, ATTND_ERR_UNAVAILABLE, "no CUDA driver (%s)", dlerror());
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        void *fn = dlsym(d->lib, syms[i].name);
        if (fn == NULL) {
            attnd_cu_unload(d);
            return attnd_errf(err, n, ATTND_ERR_UNAVAILABLE, "the CUDA driver has no %s",
                              syms[i].name);
        }
        memcpy((char *)d + syms[i].off, &fn, sizeof fn);
    }
    return ATTND_ERR_OK;
}

void attnd_cu_unload(attnd_cu_driver *d)
{
    if (d->lib != NULL) dlclose(d->lib);
    memset(d, 0, sizeof *d);
}

attnd_err attnd_cu_check(const attnd_cu_driver *d, attnd_cu_result r, const char *what, char *err,
                         size_t n)
{
    const char *s = NULL;
    if (r == 0) return ATTND_ERR_OK;
    if (d->error_string == NULL || d->error_string(r, &s) != 0 || s == NULL) s = "unknown";
    return attnd_errf(err, n, ATTND_ERR_INTERNAL, "%s: CUDA error %d (%s)", what, r, s);
}
