# cython: language_level=3
# Raw C declarations of ggml-opt.h (training: datasets, the optimizer context, epochs)
# and of pyggml's runtime helpers for it. Nothing here has behaviour.

from libc.stdint cimport int32_t, int64_t

from pyggml._ggml cimport c_bool, ggml_context, ggml_tensor, ggml_type
from pyggml._ggml_backend cimport ggml_backend_sched_t, ggml_backend_t
from pyggml._rt cimport pyggml_guard, pyggml_status


cdef extern from "ggml-opt.h" nogil:
    ctypedef struct ggml_opt_dataset:
        pass
    ctypedef ggml_opt_dataset * ggml_opt_dataset_t
    ctypedef struct ggml_opt_context:
        pass
    ctypedef ggml_opt_context * ggml_opt_context_t
    ctypedef struct ggml_opt_result:
        pass
    ctypedef ggml_opt_result * ggml_opt_result_t

    enum ggml_opt_loss_type:
        GGML_OPT_LOSS_TYPE_MEAN
        GGML_OPT_LOSS_TYPE_SUM
        GGML_OPT_LOSS_TYPE_CROSS_ENTROPY
        GGML_OPT_LOSS_TYPE_MEAN_SQUARED_ERROR

    enum ggml_opt_build_type:
        GGML_OPT_BUILD_TYPE_OPT

    enum ggml_opt_optimizer_type:
        GGML_OPT_OPTIMIZER_TYPE_ADAMW
        GGML_OPT_OPTIMIZER_TYPE_SGD

    struct _adamw_params:
        float alpha
        float beta1
        float beta2
        float eps
        float wd

    struct _sgd_params:
        float alpha
        float wd

    struct ggml_opt_optimizer_params:
        _adamw_params adamw
        _sgd_params sgd

    ctypedef ggml_opt_optimizer_params (*ggml_opt_get_optimizer_params)(void * userdata)

    struct ggml_opt_params:
        ggml_backend_sched_t backend_sched
        ggml_context * ctx_compute
        ggml_tensor * inputs
        ggml_tensor * outputs
        ggml_opt_loss_type loss_type
        ggml_opt_build_type build_type
        int32_t opt_period
        ggml_opt_get_optimizer_params get_opt_pars
        void * get_opt_pars_ud
        ggml_opt_optimizer_type optimizer

    ggml_opt_dataset_t ggml_opt_dataset_init(ggml_type type_data, ggml_type type_label, int64_t ne_datapoint,
                                             int64_t ne_label, int64_t ndata, int64_t ndata_shard)
    void ggml_opt_dataset_free(ggml_opt_dataset_t dataset)
    ggml_tensor * ggml_opt_dataset_data(ggml_opt_dataset_t dataset)
    ggml_tensor * ggml_opt_dataset_labels(ggml_opt_dataset_t dataset)
    void ggml_opt_dataset_shuffle(ggml_opt_context_t opt_ctx, ggml_opt_dataset_t dataset, int64_t idata)

    ggml_opt_params ggml_opt_default_params(ggml_backend_sched_t backend_sched, ggml_opt_loss_type loss_type)
    ggml_opt_context_t ggml_opt_init(ggml_opt_params params)
    void ggml_opt_free(ggml_opt_context_t opt_ctx)
    void ggml_opt_reset(ggml_opt_context_t opt_ctx, bint optimizer)
    ggml_tensor * ggml_opt_labels(ggml_opt_context_t opt_ctx)

    ggml_opt_result_t ggml_opt_result_init()
    void ggml_opt_result_free(ggml_opt_result_t result)
    void ggml_opt_result_ndata(ggml_opt_result_t result, int64_t * ndata)
    void ggml_opt_result_loss(ggml_opt_result_t result, double * loss, double * unc)
    void ggml_opt_result_pred(ggml_opt_result_t result, int32_t * pred)
    void ggml_opt_result_accuracy(ggml_opt_result_t result, double * accuracy, double * unc)

    ctypedef void (*ggml_opt_epoch_callback)(c_bool train, ggml_opt_context_t opt_ctx, ggml_opt_dataset_t dataset,
                                             ggml_opt_result_t result, int64_t ibatch, int64_t ibatch_max,
                                             int64_t t_start_us)
    void ggml_opt_epoch(ggml_opt_context_t opt_ctx, ggml_opt_dataset_t dataset, ggml_opt_result_t result_train,
                        ggml_opt_result_t result_eval, int64_t idata_split, ggml_opt_epoch_callback callback_train,
                        ggml_opt_epoch_callback callback_eval)


cdef extern from "pyggml_rt.h" nogil:
    ggml_opt_optimizer_params pyggml_opt_params_of(void * userdata)
    ctypedef struct pyggml_opt_probe:
        ggml_opt_params params
        ggml_opt_dataset_t dataset
        ggml_backend_t cpu
    int pyggml_opt_dry_run(pyggml_opt_probe * probe, double timeout_s, const int * abort, pyggml_status * st)

    # no C++ exception crosses into Python (csrc/nothrow.cpp)
    ggml_opt_dataset_t pyggml_opt_dataset_init_nothrow(ggml_type type_data, ggml_type type_label,
                                                       int64_t ne_datapoint, int64_t ne_label, int64_t ndata,
                                                       int64_t ndata_shard)
    ggml_opt_context_t pyggml_opt_init_nothrow(ggml_opt_params params)
    ctypedef struct pyggml_epoch:
        ggml_opt_context_t opt
        ggml_opt_dataset_t dataset
        ggml_opt_result_t result_train
        ggml_opt_result_t result_eval
        int64_t idata_split
        ggml_opt_epoch_callback callback
        int exception
    void pyggml_opt_epoch_nothrow(void * arg, const int * abort) noexcept
    int pyggml_try_opt_init(pyggml_guard * g, ggml_opt_params params, ggml_opt_context_t * out) noexcept
    int pyggml_try_opt_epoch(pyggml_guard * g, pyggml_epoch * e) noexcept
    int pyggml_try_opt_reset(pyggml_guard * g, ggml_opt_context_t opt, int optimizer) noexcept
