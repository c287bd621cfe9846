/* The public structs' layout, for bindings that declare them again (attnd_client_abi_offset).
 * One list: a field renamed or removed here fails to compile, one added to a struct and not to
 * a binding shows as a size mismatch there. */
#include <stddef.h>
#include <string.h>

#include "attnd/client.h"

/* XX(type, field) for every field of every public struct. */
#define ATTND_CLIENT_ABI_FIELDS(XX)                                                                \
    XX(attnd_client_opts, name)                                                                    \
    XX(attnd_client_opts, token)                                                                   \
    XX(attnd_client_opts, timeout_ms)                                                              \
    XX(attnd_client_opts, channel_slots)                                                           \
    XX(attnd_client_opts, spin_us)                                                                 \
    XX(attnd_geometry, num_layers)                                                                 \
    XX(attnd_geometry, num_q_heads)                                                                \
    XX(attnd_geometry, num_kv_heads)                                                               \
    XX(attnd_geometry, head_size)                                                                  \
    XX(attnd_geometry, block_size)                                                                 \
    XX(attnd_geometry, cache_dtype)                                                                \
    XX(attnd_geometry, num_blocks)                                                                 \
    XX(attnd_geometry, max_blocks_per_seq)                                                         \
    XX(attnd_geometry, scale)                                                                      \
    XX(attnd_geometry, linear_slots)                                                               \
    XX(attnd_geometry, linear_heads)                                                               \
    XX(attnd_geometry, linear_head_dim)                                                            \
    XX(attnd_geometry, window_release)                                                             \
    XX(attnd_geometry, layers)                                                                     \
    XX(attnd_layer_opts, sliding_window)                                                           \
    XX(attnd_layer_opts, softcap)                                                                  \
    XX(attnd_layer_opts, scale)                                                                    \
    XX(attnd_layer_opts, k_scale)                                                                  \
    XX(attnd_layer_opts, v_scale)                                                                  \
    XX(attnd_layer_opts, alibi)                                                                    \
    XX(attnd_layer_opts, num_alibi_slopes)                                                         \
    XX(attnd_layer_opts, alibi_slopes)                                                             \
    XX(attnd_layer_opts, num_sinks)                                                                \
    XX(attnd_layer_opts, sinks)                                                                    \
    XX(attnd_expect, num_layers)                                                                   \
    XX(attnd_expect, num_q_heads)                                                                  \
    XX(attnd_expect, num_kv_heads)                                                                 \
    XX(attnd_expect, head_size)                                                                    \
    XX(attnd_expect, block_size)                                                                   \
    XX(attnd_expect, compare_cache_dtype)                                                          \
    XX(attnd_expect, cache_dtype)                                                                  \
    XX(attnd_expect, num_layer_opts)                                                               \
    XX(attnd_expect, layer_opts)                                                                   \
    XX(attnd_limits, max_seqs)                                                                     \
    XX(attnd_limits, max_step_tokens)                                                              \
    XX(attnd_limits, max_regions)                                                                  \
    XX(attnd_limits, max_inline_bytes)                                                             \
    XX(attnd_limits, request_timeout_ms)                                                           \
    XX(attnd_server_info, protocol_version)                                                        \
    XX(attnd_server_info, session)                                                                 \
    XX(attnd_server_info, version)                                                                 \
    XX(attnd_server_info, backend)                                                                 \
    XX(attnd_server_info, geometry)                                                                \
    XX(attnd_server_info, limits)                                                                  \
    XX(attnd_server_info, blocks_free)                                                             \
    XX(attnd_status, version)                                                                      \
    XX(attnd_status, backend)                                                                      \
    XX(attnd_status, geometry)                                                                     \
    XX(attnd_status, blocks_free)                                                                  \
    XX(attnd_status, num_sequences)                                                                \
    XX(attnd_status, num_sessions)                                                                 \
    XX(attnd_status, requests)                                                                     \
    XX(attnd_status, errors)                                                                       \
    XX(attnd_status, uptime_s)                                                                     \
    XX(attnd_status, mps)                                                                          \
    XX(attnd_seq_info, seq_id)                                                                     \
    XX(attnd_seq_info, num_tokens)                                                                 \
    XX(attnd_seq_info, num_blocks)                                                                 \
    XX(attnd_seq_info, step)                                                                       \
    XX(attnd_seq_info, released_tokens)                                                            \
    XX(attnd_step_seq, seq_id)                                                                     \
    XX(attnd_step_seq, new_tokens)                                                                 \
    XX(attnd_step, id)                                                                             \
    XX(attnd_step, num_tokens)                                                                     \
    XX(attnd_ref, region)                                                                          \
    XX(attnd_ref, offset)                                                                          \
    XX(attnd_ref, dtype)                                                                           \
    XX(attnd_ref, ndim)                                                                            \
    XX(attnd_ref, shape)                                                                           \
    XX(attnd_ref, strides)                                                                         \
    XX(attnd_ref, has_strides)                                                                     \
    XX(attnd_ref, data)                                                                            \
    XX(attnd_ref, out)                                                                             \
    XX(attnd_ref, bytes)                                                                           \
    XX(attnd_shm, region)                                                                          \
    XX(attnd_shm, name)                                                                            \
    XX(attnd_shm, base)                                                                            \
    XX(attnd_shm, size)                                                                            \
    XX(attnd_merge_args, out)                                                                      \
    XX(attnd_merge_args, out_lse)                                                                  \
    XX(attnd_merge_args, prefix_out)                                                               \
    XX(attnd_merge_args, prefix_lse)                                                               \
    XX(attnd_merge_args, suffix_out)                                                               \
    XX(attnd_merge_args, suffix_lse)                                                               \
    XX(attnd_varlen_args, q)                                                                       \
    XX(attnd_varlen_args, k)                                                                       \
    XX(attnd_varlen_args, v)                                                                       \
    XX(attnd_varlen_args, out)                                                                     \
    XX(attnd_varlen_args, cu_seqlens_q)                                                            \
    XX(attnd_varlen_args, cu_seqlens_k)                                                            \
    XX(attnd_varlen_args, bias)                                                                    \
    XX(attnd_varlen_args, max_seqlen_q)                                                            \
    XX(attnd_varlen_args, max_seqlen_k)                                                            \
    XX(attnd_varlen_args, causal)                                                                  \
    XX(attnd_varlen_args, scale)                                                                   \
    XX(attnd_varlen_args, q_scale)                                                                 \
    XX(attnd_varlen_args, k_scale)                                                                 \
    XX(attnd_varlen_args, v_scale)                                                                 \
    XX(attnd_varlen_args, p_scale)                                                                 \
    XX(attnd_varlen_args, out_scale)                                                               \
    XX(attnd_blocksparse_args, q)                                                                  \
    XX(attnd_blocksparse_args, k)                                                                  \
    XX(attnd_blocksparse_args, v)                                                                  \
    XX(attnd_blocksparse_args, out)                                                                \
    XX(attnd_blocksparse_args, cu_seqlens_q)                                                       \
    XX(attnd_blocksparse_args, cu_seqlens_k)                                                       \
    XX(attnd_blocksparse_args, layout_crow)                                                        \
    XX(attnd_blocksparse_args, layout_col)                                                         \
    XX(attnd_blocksparse_args, block_size)                                                         \
    XX(attnd_blocksparse_args, q_block_size)                                                       \
    XX(attnd_blocksparse_args, max_seqlen_q)                                                       \
    XX(attnd_blocksparse_args, max_seqlen_k)                                                       \
    XX(attnd_blocksparse_args, scale)                                                              \
    XX(attnd_linear_args, layer)                                                                   \
    XX(attnd_linear_args, seq_ids)                                                                 \
    XX(attnd_linear_args, batch)                                                                   \
    XX(attnd_linear_args, q)                                                                       \
    XX(attnd_linear_args, k)                                                                       \
    XX(attnd_linear_args, v)                                                                       \
    XX(attnd_linear_args, out)                                                                     \
    XX(attnd_linear_args, slopes)                                                                  \
    XX(attnd_linear_args, num_slopes)                                                              \
    XX(attnd_linear_args, block_size)                                                              \
    XX(attnd_stream_layer, q)                                                                      \
    XX(attnd_stream_layer, k_new)                                                                  \
    XX(attnd_stream_layer, v_new)                                                                  \
    XX(attnd_stream_layer, out)                                                                    \
    XX(attnd_stream_layer, out_lse)

/* XX(type) for every public struct. */
#define ATTND_CLIENT_ABI_TYPES(XX)                                                                 \
    XX(attnd_client_opts)                                                                          \
    XX(attnd_geometry)                                                                             \
    XX(attnd_layer_opts)                                                                           \
    XX(attnd_expect)                                                                               \
    XX(attnd_limits)                                                                               \
    XX(attnd_server_info)                                                                          \
    XX(attnd_status)                                                                               \
    XX(attnd_seq_info)                                                                             \
    XX(attnd_step_seq)                                                                             \
    XX(attnd_step)                                                                                 \
    XX(attnd_ref)                                                                                  \
    XX(attnd_shm)                                                                                  \
    XX(attnd_merge_args)                                                                           \
    XX(attnd_varlen_args)                                                                          \
    XX(attnd_blocksparse_args)                                                                     \
    XX(attnd_linear_args)                                                                          \
    XX(attnd_stream_layer)

typedef struct abi_entry {
    const char *type, *field;
    size_t value;
} abi_entry;

static const abi_entry abi_table[] = {
#define ABI_TYPE(t) {#t, NULL, sizeof(t)},
#define ABI_FIELD(t, f) {#t, #f, offsetof(t, f)},
    ATTND_CLIENT_ABI_TYPES(ABI_TYPE) ATTND_CLIENT_ABI_FIELDS(ABI_FIELD)
#undef ABI_TYPE
#undef ABI_FIELD
};

size_t attnd_client_abi_offset(const char *type, const char *field)
{
    if (type == NULL) return (size_t)-1;
    for (size_t i = 0; i < sizeof abi_table / sizeof abi_table[0]; i++) {
        const abi_entry *e = &abi_table[i];
        if (strcmp(e->type, type) != 0) continue;
        if (field == NULL ? e->field == NULL : e->field != NULL && strcmp(e->field, field) == 0)
            return e->value;
    }
    return (size_t)-1;
}
