/* The blocked attention backward (attn_blocked.c) as a node of a ggml graph: a ggml
 * custom op (ggml_custom_4d) whose callback runs on ggml's compute threads.
 *
 * The node: src 0..3 = q [D,N,H,B], k [D,M,KVH,B], v [D,M,KVH,B], d [D,N,H,B] (ggml order,
 * all F32 and contiguous), optionally src 4, 5 = lse [N,H,B] and o [D,N,H,B]. Its result is
 * a 1-D F32 tensor packing dq, dk and dv one after the other, each padded to
 * PYGGML_ATTN_PAD floats (pyggml_attn_bwd_offsets); Python hands them back as views.
 *
 * Where the kernel's threads need a barrier (split mode: fewer than 4 query heads in all;
 * head mode: grouped queries over fewer than 4 (batch, kv head) pairs), the node is two:
 * the one above, whose result holds after dv a scratch for what its threads leave for each
 * other (pyggml_attn_bwd_node_plan), and an in-place node over it (ggml_custom_inplace: a
 * view of the first, its only source) whose threads reduce that scratch into dq, dk and dv;
 * ggml's threads meet between the two.  The builder returns the second.
 *
 * The scale, the two flags, whether the statistics sweep keeps its panels and the layout
 * (one node or two, and which) travel in the callbacks' userdata (a pointer-sized value,
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

typedef struct {
    float scale;
    int masked, grouping, panels, layout;
} node_flags;

static void * encode(node_flags f) {
    uint32_t bits;
    memcpy(&bits, &f.scale, sizeof bits);
    return (void *) (uintptr_t) ((uint64_t) bits | ((uint64_t) (f.masked != 0) << 32) |
                                 ((uint64_t) (f.grouping != 0) << 33) | ((uint64_t) (f.panels != 0) << 34) |
                                 ((uint64_t) (f.layout & 3) << 35));
}

static node_flags decode(void * ud) {
    const uint64_t v = (uint64_t) (uintptr_t) ud;
    const uint32_t bits = (uint32_t) v;
    node_flags f;
    memcpy(&f.scale, &bits, sizeof bits);
    f.masked = (int) ((v >> 32) & 1);
    f.grouping = (int) ((v >> 33) & 1);
    f.panels = (int) ((v >> 34) & 1);
    f.layout = (int) ((v >> 35) & 3);
    return f;
}

/* the kernel's arguments of the shapes of srcs (q, k, v, d[, lse, o]), no data */
static void shape_of(struct ggml_tensor * const * srcs, int n_srcs, node_flags f, pyggml_attn_bwd * a) {
    static const float present;
    const struct ggml_tensor * q = srcs[0], * k = srcs[1];
    memset(a, 0, sizeof *a);
    a->D = q->ne[0];
    a->N = q->ne[1];
    a->H = q->ne[2];
    a->B = q->ne[3];
    a->M = k->ne[1];
    a->KVH = k->ne[2];
    a->scale = f.scale;
    a->masked = f.masked;
    a->grouping = f.grouping;
    if (n_srcs >= 6 && srcs[4] != NULL && srcs[5] != NULL) {
        a->lse = a->o = &present;       /* only whether they are given */
    }
}

/* the node's layout and the floats of its scratch, for these sources; one node where the
 * shapes are not the kernel's (the check refuses them) */
static int plan_of(struct ggml_tensor * const * srcs, int n_srcs, node_flags f, int64_t * scratch) {
    pyggml_attn_bwd a;
    shape_of(srcs, n_srcs, f, &a);
    *scratch = 0;
    if (a.D < 1 || a.N < 1 || a.M < 1 || a.H < 1 || a.KVH < 1 || a.B < 1 || a.H % a.KVH != 0) {
        return PYGGML_ATTN_NODE_ONE;
    }
    return pyggml_attn_bwd_node_plan(&a, f.panels, scratch);
}

/* the kernel's arguments of the first node dst, with its data */
static void args_of(const struct ggml_tensor * dst, node_flags f, pyggml_attn_bwd * a) {
    const struct ggml_tensor * q = dst->src[0];
    const struct ggml_tensor * k = dst->src[1];
    int64_t offs[4];
    pyggml_attn_bwd_offsets(q, k, offs);
    shape_of((struct ggml_tensor * const *) dst->src, 6, f, a);
    a->lse = a->o = NULL;
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

static float * scratch_of(const struct ggml_tensor * first) {
    int64_t offs[4];
    pyggml_attn_bwd_offsets(first->src[0], first->src[1], offs);
    return (float *) first->data + offs[3];
}

/* The first node: ggml's compute threads call this with (ith, nth); they share no buffer
 * and no barrier, so each has a scratch of its own, and what they leave for each other
 * goes to the result's scratch, for the second node */
static void attn_bwd_callback(struct ggml_tensor * dst, int ith, int nth, void * ud) {
    const node_flags f = decode(ud);
    pyggml_attn_bwd a;
    args_of(dst, f, &a);
    size_t ws = (pyggml_attn_bwd_node_work_size(&a, f.panels, f.layout) + 63) / 64 * 64;
    void * work = aligned_alloc(64, ws);
    if (work == NULL) {
        /* no way to report from a custom op: the result is all NaN, never stale numbers */
        memset(dst->data, 0xff, ggml_nbytes(dst));
        return;
    }
    pyggml_attn_bwd_node_first(&a, f.panels, f.layout, scratch_of(dst), ith, nth, work);
    free(work);
}

/* The second node (a view of the first): the reductions after the threads have met */
static void attn_bwd_reduce_callback(struct ggml_tensor * dst, int ith, int nth, void * ud) {
    const node_flags f = decode(ud);
    const struct ggml_tensor * first = dst->src[0];
    pyggml_attn_bwd a;
    args_of(first, f, &a);
    pyggml_attn_bwd_node_second(&a, f.panels, f.layout, scratch_of(first), ith, nth);
}

int pyggml_is_attn_bwd_node(const struct ggml_tensor * t) {
    if (t->op != GGML_OP_CUSTOM) {
        return 0;
    }
    const ggml_custom_op_t fun = params_of(t).fun;
    return fun == attn_bwd_callback || fun == attn_bwd_reduce_callback;
}

static int check_first(const struct ggml_tensor * t, pg_why * why);

/* the second node: an in-place view of a first node with the same parameters */
static int check_second(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * first = t->src[0];
    if (first == NULL || first->op != GGML_OP_CUSTOM || params_of(first).fun != attn_bwd_callback) {
        return pg_refuse(why, "the reduction's source must be the attention backward's first node");
    }
    if (params_of(first).userdata != params_of(t).userdata || decode(params_of(t).userdata).layout == 0) {
        return pg_refuse(why, "the reduction's parameters must be its first node's, of a layout of two nodes");
    }
    if (t->view_src != first || t->view_offs != 0 || t->type != first->type || ggml_nbytes(t) != ggml_nbytes(first)) {
        return pg_refuse(why, "the reduction must be a view of all of its first node");
    }
    for (int i = 1; i < GGML_MAX_SRC; i++) {
        if (t->src[i] != NULL) {
            return pg_refuse(why, "the reduction has one source");
        }
    }
    return check_first(first, why);
}

int pyggml_attn_bwd_check(const struct ggml_tensor * t, pg_why * why) {
    if (params_of(t).fun == attn_bwd_reduce_callback) {
        return check_second(t, why);
    }
    return check_first(t, why);
}

/* the first node's preconditions (the kernel reads every input as dense float rows) */
static int check_first(const struct ggml_tensor * t, pg_why * why) {
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
    const node_flags f = decode(params_of(t).userdata);
    if (f.masked && k->ne[1] < q->ne[1]) {
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
    int64_t offs[4], scratch;
    pyggml_attn_bwd_offsets(q, k, offs);
    if (plan_of((struct ggml_tensor * const *) t->src, 6, f, &scratch) != f.layout) {
        return pg_refuse(why, "the node's layout is not the one its shapes take");
    }
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t) || ggml_nelements(t) < offs[3] + scratch) {
        return pg_refuse(why, "the result must be F32, contiguous and hold %lld floats",
                         (long long) (offs[3] + scratch));
    }
    return PYGGML_OK;
}

static node_flags flags_for(struct ggml_tensor ** srcs, int n_srcs, float scale, int masked, int grouping,
                            int64_t * scratch) {
    node_flags f = {scale, masked != 0, grouping != 0, pyggml_attn_bwd_panels(), 0};
    f.layout = plan_of(srcs, n_srcs, f, scratch);
    return f;
}

struct ggml_tensor * pyggml_attn_bwd_node(struct ggml_context * ctx, struct ggml_tensor ** srcs, int n_srcs,
                                          float scale, int masked, int grouping) {
    int64_t offs[4], scratch;
    pyggml_attn_bwd_offsets(srcs[0], srcs[1], offs);
    const node_flags f = flags_for(srcs, n_srcs, scale, masked, grouping, &scratch);
    struct ggml_tensor * first = ggml_custom_4d(ctx, GGML_TYPE_F32, offs[3] + scratch, 1, 1, 1, srcs, n_srcs,
                                                attn_bwd_callback, GGML_N_TASKS_MAX, encode(f));
    if (f.layout == PYGGML_ATTN_NODE_ONE) {
        return first;
    }
    return ggml_custom_inplace(ctx, first, NULL, 0, attn_bwd_reduce_callback, GGML_N_TASKS_MAX, encode(f));
}

int pyggml_attn_bwd_node_count(struct ggml_tensor ** srcs, int n_srcs) {
    int64_t scratch;
    node_flags f = {1.0f, 0, 0, pyggml_attn_bwd_panels(), 0};
    return plan_of(srcs, n_srcs, f, &scratch) == PYGGML_ATTN_NODE_ONE ? 1 : 2;
}

/* a node-shaped probe for the precondition check, before the context is touched */
void pyggml_attn_bwd_probe(struct ggml_tensor * probe, struct ggml_tensor ** srcs, int n_srcs, float scale,
                           int masked, int grouping) {
    int64_t offs[4], scratch;
    memset(probe, 0, sizeof *probe);
    pyggml_attn_bwd_offsets(srcs[0], srcs[1], offs);
    const node_flags f = flags_for(srcs, n_srcs, scale, masked, grouping, &scratch);
    probe->type = GGML_TYPE_F32;
    probe->op = GGML_OP_CUSTOM;
    probe->ne[0] = offs[3] + scratch;
    probe->ne[1] = probe->ne[2] = probe->ne[3] = 1;
    probe->nb[0] = sizeof(float);
    for (int i = 1; i < 4; i++) {
        probe->nb[i] = probe->nb[i - 1] * (size_t) probe->ne[i - 1];
    }
    custom_params p = {attn_bwd_callback, GGML_N_TASKS_MAX, encode(f)};
    memcpy(probe->op_params, &p, sizeof p);
    for (int i = 0; i < n_srcs; i++) {
        probe->src[i] = srcs[i];
    }
}

#else   /* a ggml without ggml_custom_4d: no node (Python raises GGMLVersionError) */

int pyggml_attn_bwd_node_count(struct ggml_tensor ** srcs, int n_srcs) {
    (void) srcs; (void) n_srcs;
    return 1;
}

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
