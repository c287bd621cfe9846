/* PLACEHOLDER: to be replaced by the real implementation. */
#include "cpu.h"
attnd_err attnd_cpu_linear_prefill(attnd_backend *b, const attnd_linear_prefill_params *p)
{ (void)b; (void)p; return ATTND_ERR_UNSUPPORTED; }
attnd_err attnd_cpu_linear_decode(attnd_backend *b, const attnd_linear_decode_params *p)
{ (void)b; (void)p; return ATTND_ERR_UNSUPPORTED; }
