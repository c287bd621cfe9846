/* PLACEHOLDER: to be replaced by the real implementation. */
#include "cpu.h"
attnd_err attnd_cpu_varlen(attnd_backend *b, const attnd_varlen_params *p)
{ (void)b; (void)p; return ATTND_ERR_UNSUPPORTED; }
