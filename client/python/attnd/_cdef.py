"""The declarations of client/include/attnd/client.h (and the enums of attnd/err.h and
attnd/dtype.h) as cffi reads them. _lib checks every struct's size and every field's offset
against the loaded library (attnd_client_abi_offset), so a header change that is not made here
fails at import instead of corrupting calls."""

CDEF = r"""
#define ATTND_REF_MAX_DIMS 4

typedef enum attnd_err {
    ATTND_ERR_OK = 0, ATTND_ERR_INVALID_ARGUMENT = 1, ATTND_ERR_NOT_FOUND = 2,
    ATTND_ERR_ALREADY_EXISTS = 3, ATTND_ERR_OUT_OF_BLOCKS = 4, ATTND_ERR_NO_MEMORY = 5,
    ATTND_ERR_UNAVAILABLE = 6, ATTND_ERR_UNSUPPORTED = 7, ATTND_ERR_PERMISSION_DENIED = 8,
    ATTND_ERR_TIMEOUT = 9, ATTND_ERR_PROTOCOL = 10, ATTND_ERR_INTERNAL = 11,
    ATTND_ERR_FAILED_PRECONDITION = 12
} attnd_err;

typedef enum attnd_dtype {
    ATTND_DTYPE_F32 = 0, ATTND_DTYPE_F16 = 1, ATTND_DTYPE_BF16 = 2, ATTND_DTYPE_FP8_E4M3 = 3,
    ATTND_DTYPE_I32 = 4, ATTND_DTYPE_I64 = 5, ATTND_DTYPE_COUNT = 6
} attnd_dtype;

const char *attnd_strerror(attnd_err err);
const char *attnd_err_name(attnd_err err);
const char *attnd_dtype_name(attnd_dtype dt);

typedef struct attnd_client attnd_client;

typedef struct attnd_client_opts {
    const char *name;
    const char *token;
    int32_t timeout_ms;
    int32_t channel_slots;
    int32_t spin_us;
} attnd_client_opts;

typedef struct attnd_layer_opts {
    uint32_t sliding_window;
    float softcap;
    float scale;
    float k_scale, v_scale;
    int32_t alibi;
    uint32_t num_alibi_slopes;
    const float *alibi_slopes;
    uint32_t num_sinks;
    const float *sinks;
} attnd_layer_opts;

typedef struct attnd_geometry {
    uint32_t num_layers;
    uint32_t num_q_heads;
    uint32_t num_kv_heads;
    uint32_t head_size;
    uint32_t block_size;
    attnd_dtype cache_dtype;
    uint32_t num_blocks;
    uint32_t max_blocks_per_seq;
    float scale;
    uint32_t linear_slots;
    uint32_t linear_heads;
    uint32_t linear_head_dim;
    uint32_t window_release;
    const attnd_layer_opts *layers;
} attnd_geometry;

typedef struct attnd_expect {
    uint32_t num_layers, num_q_heads, num_kv_heads, head_size, block_size;
    int32_t compare_cache_dtype;
    attnd_dtype cache_dtype;
    uint32_t num_layer_opts;
    const attnd_layer_opts *layer_opts;
} attnd_expect;

typedef struct attnd_limits {
    uint32_t max_seqs;
    uint32_t max_step_tokens;
    uint32_t max_regions;
    uint64_t max_inline_bytes;
    uint32_t request_timeout_ms;
} attnd_limits;

typedef struct attnd_server_info {
    uint32_t protocol_version;
    uint64_t session;
    char version[64];
    char backend[16];
    attnd_geometry geometry;
    attnd_limits limits;
    uint32_t blocks_free;
} attnd_server_info;

typedef struct attnd_status {
    char version[64];
    char backend[16];
    attnd_geometry geometry;
    uint32_t blocks_free;
    uint32_t num_sequences;
    uint32_t num_sessions;
    uint64_t requests;
    uint64_t errors;
    double uptime_s;
    int32_t mps;
} attnd_status;

typedef struct attnd_seq_info {
    uint64_t seq_id;
    uint32_t num_tokens;
    uint32_t num_blocks;
    uint64_t step;
    uint32_t released_tokens;
} attnd_seq_info;

typedef struct attnd_step_seq {
    uint64_t seq_id;
    uint32_t new_tokens;
} attnd_step_seq;

typedef struct attnd_step {
    uint64_t id;
    uint32_t num_tokens;
} attnd_step;

typedef struct attnd_ref {
    uint32_t region;
    uint64_t offset;
    attnd_dtype dtype;
    int32_t ndim;
    int64_t shape[4];
    int64_t strides[4];
    int32_t has_strides;
    const void *data;
    void *out;
    size_t bytes;
} attnd_ref;

typedef struct attnd_shm {
    uint32_t region;
    char name[64];
    void *base;
    size_t size;
} attnd_shm;

attnd_err attnd_client_alloc(attnd_client **c, const attnd_client_opts *opts);
void attnd_client_free(attnd_client *c);
attnd_err attnd_client_set_tls(attnd_client *c, const char *ca_file, const char *server_name);
attnd_err attnd_client_dial(attnd_client *c, const char *url);
attnd_err attnd_client_set_expect(attnd_client *c, const attnd_expect *expect);
attnd_err attnd_client_hello(attnd_client *c, attnd_server_info *info);
attnd_err attnd_client_connect(attnd_client *c, const char *url, attnd_server_info *info);
const attnd_server_info *attnd_client_server(const attnd_client *c);
uint64_t attnd_client_session(const attnd_client *c);
void attnd_client_set_timeout(attnd_client *c, int32_t timeout_ms);
void attnd_client_set_spin(attnd_client *c, int32_t spin_us);
const char *attnd_client_last_error(const attnd_client *c);
int attnd_client_last_error_remote(const attnd_client *c);
size_t attnd_client_last_error_copy(const attnd_client *c, char *buf, size_t len);
attnd_err attnd_client_status(attnd_client *c, attnd_status *st);

attnd_err attnd_client_channel_open(attnd_client *c, int32_t slots);
attnd_err attnd_client_channel_close(attnd_client *c);
int attnd_client_channel_active(const attnd_client *c);
const char *attnd_client_channel_error(const attnd_client *c);

attnd_err attnd_client_region_register_shm(attnd_client *c, uint32_t region,
                                           const char *shm_name, uint64_t size);
attnd_err attnd_client_region_register_cuda(attnd_client *c, uint32_t region,
                                            const void *ipc_handle, uint64_t size, int32_t device);
attnd_err attnd_client_region_register_cuda_ptr(attnd_client *c, uint32_t region,
                                                const void *ptr, uint64_t nbytes, uint64_t *base);
attnd_err attnd_client_region_unregister(attnd_client *c, uint32_t region);
uint32_t attnd_client_region_next_id(attnd_client *c);
attnd_err attnd_client_shm_create(attnd_client *c, size_t size, attnd_shm *shm);
attnd_err attnd_client_shm_destroy(attnd_client *c, attnd_shm *shm);

size_t attnd_ref_nbytes(attnd_dtype dtype, int32_t ndim, const int64_t *shape);

attnd_err attnd_client_seq_create(attnd_client *c, uint64_t seq_id, attnd_seq_info *info);
attnd_err attnd_client_seq_fork(attnd_client *c, uint64_t parent, uint64_t child,
                                attnd_seq_info *info);
attnd_err attnd_client_seq_free(attnd_client *c, uint64_t seq_id);
attnd_err attnd_client_seq_truncate(attnd_client *c, uint64_t seq_id, uint32_t tokens,
                                    attnd_seq_info *info);
attnd_err attnd_client_seq_query(attnd_client *c, uint64_t seq_id, attnd_seq_info *info);
attnd_err attnd_client_seq_list(attnd_client *c, attnd_seq_info *seqs, size_t cap, size_t *n);
attnd_err attnd_client_step_begin(attnd_client *c, const attnd_step_seq *seqs, size_t n,
                                  attnd_step *step, uint32_t *query_start_loc);
attnd_err attnd_client_step_end(attnd_client *c, uint64_t step, int abort);

attnd_err attnd_client_attend(attnd_client *c, uint64_t step, uint32_t layer, const attnd_ref *q,
                              const attnd_ref *k_new, const attnd_ref *v_new, attnd_ref *out,
                              attnd_ref *out_lse);

typedef struct attnd_merge_args {
    attnd_ref *out, *out_lse;
    const attnd_ref *prefix_out, *prefix_lse, *suffix_out, *suffix_lse;
} attnd_merge_args;
attnd_err attnd_client_merge(attnd_client *c, const attnd_merge_args *a);

typedef struct attnd_varlen_args {
    const attnd_ref *q, *k, *v;
    attnd_ref *out;
    const attnd_ref *cu_seqlens_q, *cu_seqlens_k, *bias;
    int32_t max_seqlen_q, max_seqlen_k;
    int32_t causal;
    float scale;
    float q_scale, k_scale, v_scale, p_scale, out_scale;
} attnd_varlen_args;
attnd_err attnd_client_varlen(attnd_client *c, const attnd_varlen_args *a);

typedef struct attnd_blocksparse_args {
    const attnd_ref *q, *k, *v;
    attnd_ref *out;
    const attnd_ref *cu_seqlens_q, *cu_seqlens_k, *layout_crow, *layout_col;
    int32_t block_size, q_block_size;
    int32_t max_seqlen_q, max_seqlen_k;
    float scale;
} attnd_blocksparse_args;
attnd_err attnd_client_blocksparse(attnd_client *c, const attnd_blocksparse_args *a);

typedef struct attnd_linear_args {
    uint32_t layer;
    const uint64_t *seq_ids;
    size_t batch;
    const attnd_ref *q, *k, *v;
    attnd_ref *out;
    const float *slopes;
    size_t num_slopes;
    int32_t block_size;
} attnd_linear_args;
attnd_err attnd_client_linear_prefill(attnd_client *c, const attnd_linear_args *a);
attnd_err attnd_client_linear_decode(attnd_client *c, const attnd_linear_args *a);

typedef struct attnd_client_stream attnd_client_stream;
typedef struct attnd_stream_layer {
    const attnd_ref *q, *k_new, *v_new;
    const attnd_ref *out, *out_lse;
} attnd_stream_layer;
attnd_err attnd_client_stream_open(attnd_client *c, attnd_client_stream **s);
void attnd_client_stream_close(attnd_client_stream *s);
uint32_t attnd_client_stream_id(const attnd_client_stream *s);
int attnd_client_stream_failed(const attnd_client_stream *s);
attnd_err attnd_client_stream_begin(attnd_client_stream *s, const attnd_step_seq *seqs, size_t n,
                                    const attnd_stream_layer *layers, size_t nlayers,
                                    attnd_step *step, uint32_t *query_start_loc);
attnd_err attnd_client_stream_signal(attnd_client_stream *s, uint32_t layer, void *stream);
attnd_err attnd_client_stream_wait(attnd_client_stream *s, uint32_t layer, void *stream);
attnd_err attnd_client_attend_async(attnd_client_stream *s, uint32_t layer, void *stream);
attnd_err attnd_client_stream_end(attnd_client_stream *s, uint64_t step, int abort);
void attnd_client_stream_release(attnd_client_stream *s);

size_t attnd_client_abi_offset(const char *type, const char *field);
"""

# Every struct declared above; _lib checks each against the library.
STRUCTS = (
    "attnd_client_opts", "attnd_layer_opts", "attnd_geometry", "attnd_expect", "attnd_limits",
    "attnd_server_info", "attnd_status", "attnd_seq_info", "attnd_step_seq", "attnd_step", "attnd_ref", "attnd_shm",
    "attnd_merge_args", "attnd_varlen_args", "attnd_blocksparse_args", "attnd_linear_args",
    "attnd_stream_layer",
)
