/* The seed's FLASH_ATTN_BACK node, built by pyggml (the row flash_attn_back of ops.txt is
 * impl=pyggml: upstream's own builder now aborts, its CPU kernel still runs).
 *
 * The contract is the seed's (../shared/seed, pyggml's docs): q [D,N,ne2,ne3],
 * k [D,M,kvne2,ne3], v [M,D,kvne2,ne3] (transposed), d [D,N,ne2,ne3], ne2 a multiple of
 * kvne2. The result is one 1-D F32 tensor that packs grad_q, grad_k and grad_v one after
 * the other, each starting at an offset padded to GGML_MEM_ALIGN; op_params[0] is masked.
 *
 * The generated wrapper calls this under the abort guard, after pyggml._prechecks has
 * checked the shape contract with messages of its own: the asserts here are the contract
 * stated where the node is made, so a caller that skips the wrapper still gets ggml's
 * abort and not a malformed node. */
#include "pyggml_rt.h"
#include "pyggml_config.h"

#include <string.h>

void pyggml_flash_attn_back_offsets(const struct ggml_tensor * q, const struct ggml_tensor * k,
                                    const struct ggml_tensor * v, size_t offs[4]) {
    const size_t tsize = ggml_type_size(GGML_TYPE_F32);
    offs[0] = 0;
    offs[1] = offs[0] + GGML_PAD((size_t) ggml_nelements(q) * tsize, GGML_MEM_ALIGN);
    offs[2] = offs[1] + GGML_PAD((size_t) ggml_nelements(k) * tsize, GGML_MEM_ALIGN);
    offs[3] = offs[2] + GGML_PAD((size_t) ggml_nelements(v) * tsize, GGML_MEM_ALIGN);
}

struct ggml_tensor * pyggml_flash_attn_back_padded(struct ggml_context * ctx, struct ggml_tensor * q,
                                                   struct ggml_tensor * k, struct ggml_tensor * v,
                                                   struct ggml_tensor * d, bool masked, int64_t extra) {
    const int64_t D = q->ne[0], N = q->ne[1], M = k->ne[1];
    const int64_t ne2 = q->ne[2], ne3 = q->ne[3], kvne2 = k->ne[2];
    GGML_ASSERT(k->ne[0] == D);
    GGML_ASSERT(v->ne[0] == M && v->ne[1] == D && v->ne[2] == kvne2 && v->ne[3] == ne3);
    GGML_ASSERT(d->ne[0] == D && d->ne[1] == N && d->ne[2] == ne2 && d->ne[3] == ne3);
    GGML_ASSERT(k->ne[3] == ne3);
    GGML_ASSERT(kvne2 > 0 && ne2 % kvne2 == 0);
    GGML_ASSERT(extra >= 0);
#if !PYGGML_HAVE_FLASH_ATTN_BACK
    GGML_ABORT("this ggml has no GGML_OP_FLASH_ATTN_BACK");
#endif

    size_t offs[4];
    pyggml_flash_attn_back_offsets(q, k, v, offs);
    const size_t tsize = ggml_type_size(GGML_TYPE_F32);
    const int64_t ne[1] = {(int64_t) ((offs[3] + tsize - 1) / tsize) + extra};
    struct ggml_tensor * result = ggml_new_tensor(ctx, GGML_TYPE_F32, 1, ne);

    const int32_t masked_i = masked ? 1 : 0;
    memcpy(result->op_params, &masked_i, sizeof(masked_i));
#if PYGGML_HAVE_FLASH_ATTN_BACK
    result->op = GGML_OP_FLASH_ATTN_BACK;
#endif
    result->src[0] = q;
    result->src[1] = k;
    result->src[2] = v;
    result->src[3] = d;
    return result;
}

struct ggml_tensor * pyggml_flash_attn_back(struct ggml_context * ctx, struct ggml_tensor * q,
                                            struct ggml_tensor * k, struct ggml_tensor * v,
                                            struct ggml_tensor * d, bool masked) {
    return pyggml_flash_attn_back_padded(ctx, q, k, v, d, masked, 0);
}
