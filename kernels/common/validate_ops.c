/* PLACEHOLDER: replaced by the real validators. */
#include "validate.h"
attnd_err attnd_validate_merge(attnd_backend *b, const attnd_merge_params *p) { (void)b; (void)p; return ATTND_ERR_OK; }
attnd_err attnd_validate_varlen(attnd_backend *b, const attnd_varlen_params *p, int h) { (void)b; (void)p; (void)h; return ATTND_ERR_OK; }
attnd_err attnd_validate_blocksparse(attnd_backend *b, const attnd_blocksparse_params *p, int h) { (void)b; (void)p; (void)h; return ATTND_ERR_OK; }
attnd_err attnd_validate_linear_prefill(attnd_backend *b, const attnd_linear_prefill_params *p) { (void)b; (void)p; return ATTND_ERR_OK; }
attnd_err attnd_validate_linear_decode(attnd_backend *b, const attnd_linear_decode_params *p, int h) { (void)b; (void)p; (void)h; return ATTND_ERR_OK; }
