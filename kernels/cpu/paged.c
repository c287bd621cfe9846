/* PLACEHOLDER: to be replaced by the real implementation. */
#include "cpu.h"
attnd_err attnd_cpu_paged_2d(attnd_backend *b, const attnd_paged_params *p)
{ (void)b; (void)p; return ATTND_ERR_UNSUPPORTED; }
attnd_err attnd_cpu_paged_3d(attnd_backend *b, const attnd_paged_params *p, int32_t num_segments, void *workspace)
{ (void)b; (void)p; (void)num_segments; (void)workspace; return ATTND_ERR_UNSUPPORTED; }
