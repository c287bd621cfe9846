/* PLACEHOLDER: to be replaced by the real implementation. */
#include "cpu.h"
attnd_err attnd_cpu_merge_states(attnd_backend *b, const attnd_merge_params *p)
{ (void)b; (void)p; return ATTND_ERR_UNSUPPORTED; }
