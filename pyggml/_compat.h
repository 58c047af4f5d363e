/* ggml.h and ggml-cpu.h, plus stand-ins for what the ggml being built against lacks.
 * CMake's feature checks (CMakeLists.txt) decide, from the headers actually used. */
#pragma once
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "pyggml_config.h"

#if !PYGGML_HAVE_GGML_VERSION
static inline const char * ggml_version(void) { return PYGGML_GGML_CMAKE_VERSION; }
static inline const char * ggml_commit(void) { return "unknown"; }
#endif


/* the CPU backend's reference implementations for one compute (ggml_cplan.use_ref):
 * 1 when set (or not asked for), 0 when this ggml has no such switch */
static inline int pyggml_plan_use_ref(struct ggml_cplan * plan, int on) {
#if PYGGML_HAVE_USE_REF
    plan->use_ref = on != 0;
    return 1;
#else
    (void) plan;
    return !on;
#endif
}

/* the same switch for every compute of a CPU backend: 1 when set (or not asked for),
 * 0 when this ggml has no such switch */
static inline int pyggml_backend_cpu_set_use_ref(ggml_backend_t backend, int on) {
#if PYGGML_HAVE_USE_REF
    ggml_backend_cpu_set_use_ref(backend, on != 0);
    return 1;
#else
    (void) backend;
    return !on;
#endif
}

/* 1 where ggml.h defines the interleaved multi-rope mode (the rules refuse it elsewhere) */
#ifdef GGML_ROPE_TYPE_IMROPE
#define PYGGML_HAVE_ROPE_IMROPE 1
#else
#define PYGGML_HAVE_ROPE_IMROPE 0
#endif

#if !PYGGML_HAVE_ROPE_SET_OFFSET
/* never called: rope_set_offset() raises GGMLVersionError first */
static inline struct ggml_tensor * ggml_rope_set_offset(struct ggml_tensor * a, int n_offs) {
    (void) n_offs;
    return a;
}
#endif

#if !PYGGML_HAVE_ADD_SINKS
/* never called: soft_max_add_sinks() and flash_attn_ext_add_sinks() raise GGMLVersionError first */
static inline void ggml_soft_max_add_sinks(struct ggml_tensor * a, struct ggml_tensor * sinks) {
    (void) a;
    (void) sinks;
}
static inline void ggml_flash_attn_ext_add_sinks(struct ggml_tensor * a, struct ggml_tensor * sinks) {
    (void) a;
    (void) sinks;
}
#endif

#if !PYGGML_HAVE_FA_N_KV_MAX
/* never called: flash_attn_ext_set_n_kv_max() raises GGMLVersionError first */
static inline void ggml_flash_attn_ext_set_n_kv_max(struct ggml_tensor * a, int32_t n_kv_max) {
    (void) a;
    (void) n_kv_max;
}
#endif

#if !PYGGML_HAVE_PREC_SET
/* never called: prec_set_acc() and prec_set_src() raise GGMLVersionError first */
static inline bool ggml_prec_set_acc(struct ggml_tensor * a, enum ggml_prec prec) {
    (void) a;
    (void) prec;
    return false;
}
static inline bool ggml_prec_set_src(struct ggml_tensor * a, enum ggml_prec prec, int idx) {
    (void) a;
    (void) prec;
    (void) idx;
    return false;
}
#endif

#if !PYGGML_HAVE_MUL_MAT_SET_HINT
/* never called: mul_mat_set_hint() raises GGMLVersionError first */
static inline void ggml_mul_mat_set_hint(struct ggml_tensor * a, int hint) {
    (void) a;
    (void) hint;
}
#endif

#if !PYGGML_HAVE_FLASH_ATTN_BACK
/* an op value no node carries: flash_attn_back() raises NotImplementedError */
#define GGML_OP_FLASH_ATTN_BACK GGML_OP_COUNT
#endif
