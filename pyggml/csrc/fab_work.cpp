/* FLASH_ATTN_BACK's work buffer, computed in one place for everyone: the CPU executor
 * that allocates it (Graph.compute), the backend check that refuses what ggml's own plan
 * under-sizes, the seed's batch+GQA probe and the "fab-work-size" defect probe.
 *
 * The F32 FLASH_ATTN_BACK kernel of ggml-cpu (ops.cpp) gives thread ith the floats
 * S at ith*2*(mxDM + CL) and SM at (2*ith + 1)*(mxDM + CL) of the work buffer; SM runs
 * to Mup: M rounded up to GGML_SOFT_MAX_UNROLL (4, ggml-cpu/vec.h), mxDM = max(D, Mup),
 * CL = CACHE_LINE_SIZE_F32. So n threads touch (2n - 1)(mxDM + CL) + Mup floats.
 * ggml_graph_plan reserves 2*mxDM*n floats twice over, which is less when D < 8 and
 * M <= 4 on 3 or more threads (pyggml.defects "fab-work-size").
 *
 * C++, so that CACHE_LINE_SIZE is what ggml-cpu/ops.h makes of it with the same compiler
 * and standard (C++17): std::hardware_destructive_interference_size where the library
 * has it, else 128 (POWER9), 256 (s390x vector) or 64. */
#include <algorithm>
#include <cstdint>
#include <new>

#include "pyggml_rt.h"

#include "ggml.h"

static size_t cache_line_floats() {
#if defined(__cpp_lib_hardware_interference_size)
    return std::hardware_destructive_interference_size / sizeof(float);
#elif defined(__POWER9_VECTOR__)
    return 128 / sizeof(float);
#elif defined(__VXE__) || defined(__VXE2__)
    return 256 / sizeof(float);
#else
    return 64 / sizeof(float);
#endif
}

extern "C" size_t pyggml_fab_work_bytes(int64_t D, int64_t M, int n_threads) {
    if (D < 0 || M < 0 || n_threads < 1) {
        return 0;
    }
    const int64_t mup = (M + 3) / 4 * 4;
    const int64_t mxdm = std::max(D, mup);
    const int64_t cl = (int64_t) cache_line_floats();
    return sizeof(float) * (size_t) ((2 * (int64_t) n_threads - 1) * (mxdm + cl) + mup);
}

extern "C" size_t pyggml_graph_fab_work_bytes(struct ggml_cgraph * graph, int n_threads) {
    size_t need = 0;
    for (int i = 0; i < ggml_graph_n_nodes(graph); i++) {
        const struct ggml_tensor * t = ggml_graph_node(graph, i);
        if (t->op == GGML_OP_FLASH_ATTN_BACK && t->src[0] != NULL && t->src[1] != NULL) {
            need = std::max(need, pyggml_fab_work_bytes(t->src[0]->ne[0], t->src[1]->ne[1], n_threads));
        }
    }
    return need;
}
