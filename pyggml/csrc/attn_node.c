/* The blocked attention backward (attn_blocked.c) as a node of a ggml graph: a ggml
 * custom op (ggml_custom_4d) whose callback runs on ggml's compute threads.
 *
 * The node: src 0..3 = q [D,N,H,B], k [D,M,KVH,B], v [D,M,KVH,B], d [D,N,H,B] (ggml order,
 * all F32 and contiguous), optionally src 4, 5 = lse [N,H,B] and o [D,N,H,B]. Its result is
 * a 1-D F32 tensor packing dq, dk and dv one after the other, each padded to
 * PYGGML_ATTN_PAD floats (pyggml_attn_bwd_offsets); Python hands them back as views.
 * The scale and the two flags travel in the callback's userdata (a pointer-sized value,
 * so the node needs no memory that could outlive it). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attn_blocked.h"
#include "preconditions.h"
#include "pyggml_config.h"

#if PYGGML_HAVE_CUSTOM_4D

#define PYGGML_ATTN_PAD 16       /* floats: 64 bytes, a cache line */

/* what ggml_custom_4d copies into op_params: the callback, its task count, its userdata
 * (the members of ggml_custom_4d's parameters, in its order: the C ABI fixes the layout) */
typedef struct {
    ggml_custom_op_t fun;
    int n_tasks;
    void * userdata;
} custom_params;

static custom_params params_of(const struct ggml_tensor * t) {
    custom_params p;
    memcpy(&p, t->op_params, sizeof p);
    return p;
}

static int64_t pad_floats(int64_t n) {
    return (n + PYGGML_ATTN_PAD - 1) / PYGGML_ATTN_PAD * PYGGML_ATTN_PAD;
}

void pyggml_attn_bwd_offsets(const struct ggml_tensor * q, const struct ggml_tensor * k, int64_t offs[4]) {
    offs[0] = 0;
    offs[1] = offs[0] + pad_floats(ggml_nelements(q));
    offs[2] = offs[1] + pad_floats(ggml_nelements(k));
    offs[3] = offs[2] + pad_floats(ggml_nelements(k));
}

static void * encode(float scale, int masked, int grouping) {
    uint32_t bits;
    memcpy(&bits, &scale, sizeof bits);
    return (void *) (uintptr_t) ((uint64_t) bits | ((uint64_t) (masked != 0) << 32) |
                                 ((uint64_t) (grouping != 0) << 33));
}

static void decode(void * ud, float * scale, int * masked, int * grouping) {
    const uint64_t v = (uint64_t) (uintptr_t) ud;
    const uint32_t bits = (uint32_t) v;
    memcpy(scale, &bits, sizeof bits);
    *masked = (int) ((v >> 32) & 1);
    *grouping = (int) ((v >> 33) & 1);
}

static void args_of(const struct ggml_tensor * dst, void * ud, pyggml_attn_bwd * a) {
    const struct ggml_tensor * q = dst->src[0];
    const struct ggml_tensor * k = dst->src[1];
    int64_t offs[4];
    pyggml_attn_bwd_offsets(q, k, offs);
    memset(a, 0, sizeof *a);
    a->D = q->ne[0];
    a->N = q->ne[1];
    a->H = q->ne[2];
    a->B = q->ne[3];
    a->M = k->ne[1];
    a->KVH = k->ne[2];
    decode(ud, &a->scale, &a->masked, &a->grouping);
    a->q = q->data;
    a->k = k->data;
    a->v = dst->src[2]->data;
    a->d = dst->src[3]->data;
    if (dst->src[4] != NULL && dst->src[5] != NULL) {
        a->lse = dst->src[4]->data;
        a->o = dst->src[5]->data;
    }
    float * out = dst->data;
    a->dq = out + offs[0];
    a->dk = out + offs[1];
    a->dv = out + offs[2];
}

/* ggml's compute threads call this with (ith, nth); they share no scratch and no barrier,
 * so each thread takes whole (batch, kv head) groups with a scratch of its own */
static void attn_bwd_callback(struct ggml_tensor * dst, int ith, int nth, void * ud) {
    pyggml_attn_bwd a;
    args_of(dst, ud, &a);
    size_t ws = (pyggml_attn_bwd_thread_work_size(&a) + 63) / 64 * 64;
    void * work = aligned_alloc(64, ws);
    if (work == NULL) {
        /* no way to report from a custom op: the result is all NaN, never stale numbers */
        memset(dst->data, 0xff, ggml_nbytes(dst));
        return;
    }
    pyggml_attn_bwd_run_alone(&a, ith, nth, work);
    free(work);
}

int pyggml_is_attn_bwd_node(const struct ggml_tensor * t) {
    return t->op == GGML_OP_CUSTOM && params_of(t).fun == attn_bwd_callback;
}

/* the node's preconditions (the kernel reads every input as dense float rows) */
int pyggml_attn_bwd_check(const struct ggml_tensor * t, pg_why * why) {
    const char * names[6] = {"q", "k", "v", "d", "lse", "o"};
    for (int i = 0; i < 4; i++) {
        PG_NEED_SRC(t, i, why);
    }
    if ((t->src[4] == NULL) != (t->src[5] == NULL)) {
        return pg_refuse(why, "lse and o come together (the saved statistics need the forward output)");
    }
    for (int i = 0; i < 6; i++) {
        const struct ggml_tensor * x = t->src[i];
        if (x == NULL) {
            continue;
        }
        if (x->type != GGML_TYPE_F32) {
            return pg_refuse_type(why, "%s has type %s; the blocked kernel reads F32", names[i], pg_type(x));
        }
        PG_NEED_CONTIGUOUS(x, names[i], why);
    }
    const struct ggml_tensor * q = t->src[0], * k = t->src[1], * v = t->src[2], * d = t->src[3];
    for (int i = 0; i < 4; i++) {
        if (q->ne[i] < 1 || k->ne[i] < 1) {
            return pg_refuse(why, "empty q or k");
        }
        if (k->ne[i] != v->ne[i] || q->ne[i] != d->ne[i]) {
            return pg_refuse(why, "v must have k's shape and d q's");
        }
    }
    if (k->ne[0] != q->ne[0] || k->ne[3] != q->ne[3] || q->ne[2] % k->ne[2] != 0) {
        return pg_refuse(why, "k [D,M,KVH,B] must match q [D,N,H,B] in D and B, with H a multiple of KVH");
    }
    float scale;
    int masked, grouping;
    decode(params_of(t).userdata, &scale, &masked, &grouping);
    if (masked && k->ne[1] < q->ne[1]) {
        return pg_refuse(why, "masked needs M >= N keys");
    }
    if (t->src[4] != NULL) {
        const struct ggml_tensor * lse = t->src[4], * o = t->src[5];
        if (lse->ne[0] != q->ne[1] || lse->ne[1] != q->ne[2] || lse->ne[2] != q->ne[3] || lse->ne[3] != 1) {
            return pg_refuse(why, "lse must be [N,H,B]");
        }
        for (int i = 0; i < 4; i++) {
            if (o->ne[i] != q->ne[i]) {
                return pg_refuse(why, "o must have q's shape");
            }
        }
    }
    int64_t offs[4];
    pyggml_attn_bwd_offsets(q, k, offs);
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t) || ggml_nelements(t) < offs[3]) {
        return pg_refuse(why, "the result must be F32, contiguous and hold %lld floats", (long long) offs[3]);
    }
    return PYGGML_OK;
}

struct ggml_tensor * pyggml_attn_bwd_node(struct ggml_context * ctx, struct ggml_tensor ** srcs, int n_srcs,
                                          float scale, int masked, int grouping) {
    int64_t offs[4];
    pyggml_attn_bwd_offsets(srcs[0], srcs[1], offs);
    return ggml_custom_4d(ctx, GGML_TYPE_F32, offs[3], 1, 1, 1, srcs, n_srcs, attn_bwd_callback,
                          GGML_N_TASKS_MAX, encode(scale, masked, grouping));
}

/* a node-shaped probe for the precondition check, before the context is touched */
void pyggml_attn_bwd_probe(struct ggml_tensor * probe, struct ggml_tensor ** srcs, int n_srcs, float scale,
                           int masked, int grouping) {
    int64_t offs[4];
    memset(probe, 0, sizeof *probe);
    pyggml_attn_bwd_offsets(srcs[0], srcs[1], offs);
    probe->type = GGML_TYPE_F32;
    probe->op = GGML_OP_CUSTOM;
    probe->ne[0] = offs[3];
    probe->ne[1] = probe->ne[2] = probe->ne[3] = 1;
    probe->nb[0] = sizeof(float);
    for (int i = 1; i < 4; i++) {
        probe->nb[i] = probe->nb[i - 1] * (size_t) probe->ne[i - 1];
    }
    custom_params p = {attn_bwd_callback, GGML_N_TASKS_MAX, encode(scale, masked, grouping)};
    memcpy(probe->op_params, &p, sizeof p);
    for (int i = 0; i < n_srcs; i++) {
        probe->src[i] = srcs[i];
    }
}

#else   /* a ggml without ggml_custom_4d: no node (Python raises GGMLVersionError) */

void pyggml_attn_bwd_offsets(const struct ggml_tensor * q, const struct ggml_tensor * k, int64_t offs[4]) {
    (void) q; (void) k;
    memset(offs, 0, 4 * sizeof offs[0]);
}

int pyggml_is_attn_bwd_node(const struct ggml_tensor * t) {
    (void) t;
    return 0;
}

int pyggml_attn_bwd_check(const struct ggml_tensor * t, pg_why * why) {
    (void) t;
    return pg_refuse(why, "this ggml has no ggml_custom_4d");
}

struct ggml_tensor * pyggml_attn_bwd_node(struct ggml_context * ctx, struct ggml_tensor ** srcs, int n_srcs,
                                          float scale, int masked, int grouping) {
    (void) ctx; (void) srcs; (void) n_srcs; (void) scale; (void) masked; (void) grouping;
    return NULL;
}

void pyggml_attn_bwd_probe(struct ggml_tensor * probe, struct ggml_tensor ** srcs, int n_srcs, float scale,
                           int masked, int grouping) {
    (void) srcs; (void) n_srcs; (void) scale; (void) masked; (void) grouping;
    memset(probe, 0, sizeof *probe);
}
#endif
