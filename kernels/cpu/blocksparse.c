/* PLACEHOLDER: to be replaced by the real implementation. */
#include "cpu.h"
attnd_err attnd_cpu_blocksparse(attnd_backend *b, const attnd_blocksparse_params *p)
{ (void)b; (void)p; return ATTND_ERR_UNSUPPORTED; }
