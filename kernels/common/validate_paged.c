/* PLACEHOLDER: replaced by the real validators. */
#include "validate.h"
attnd_err attnd_validate_paged(attnd_backend *b, const attnd_paged_params *p, int h) { (void)b; (void)p; (void)h; return ATTND_ERR_OK; }
attnd_err attnd_validate_cache_write(attnd_backend *b, const attnd_cache_write_params *p, int h) { (void)b; (void)p; (void)h; return ATTND_ERR_OK; }
