# Included by _core.pyx: how every graph builder is called, and the node checks.
#
# A generated wrapper (see pyggml/_gen_ops.py) does, for a builder ggml_f:
#
#     r = pyggml_try_f(&g, op_scratch(ctx), args...)   # 1. in the scratch context
#     if op_check(ctx, r, &g, "f"):                    # 2. abort? kernel refusal? room?
#         op_fail(ctx, r, &g, "f", names, tensors)     #    (raises, saying which)
#     r = pyggml_try_f(&g, ctx.ptr, args...)           # 3. for real: the same call
#     ctx._depend_on(...) for tensors of other contexts; return wrap(ctx, r)
#
# The scratch run is the same deterministic call on the same inputs, in a no_alloc
# context: ggml only reads no_alloc when it sizes a tensor's data. So it shows exactly
# what the real call would do (abort, and where; which nodes and how many bytes it
# creates) without touching the caller's context.

cdef ggml_context * _scratch = NULL
cdef Storage _scratch_pool = Storage(1 << 20)     # room for ~2,800 tensor headers


cdef _init_scratch():
    global _scratch
    cdef ggml_init_params params
    params.mem_size = _scratch_pool.size
    params.mem_buffer = _scratch_pool.ptr
    params.no_alloc = True
    _scratch = ggml_init(params)

_init_scratch()


cdef ggml_context * op_scratch(Context ctx) except NULL:
    need_open(ctx)
    ggml_reset(_scratch)
    return _scratch


cdef uint64_t tensor_bytes(const ggml_tensor * t, bint no_alloc) except? 0:
    """What ggml_new_tensor_impl takes from a context for a tensor shaped like ``t``."""
    cdef uint64_t data = 0
    cdef int i
    if t.view_src == NULL and not no_alloc:
        data = ggml_row_size(t.type, t.ne[0])
        for i in range(1, 4):
            if t.ne[i] != 0 and data > <uint64_t>(_INT64_MAX >> 1) // <uint64_t>t.ne[i]:
                return <uint64_t>_INT64_MAX      # cannot fit any context
            data *= t.ne[i]
    return _OBJECT_SIZE + _pad(sizeof(ggml_tensor) + data)


cdef int op_check(Context ctx, ggml_tensor * r, pyggml_guard * g, str op) except -1:
    """After the scratch run: 0 when the real call can follow; 1 when it must not (ggml
    aborted, a new node's kernel would refuse it, or ctx lacks the room), and the
    wrapper calls op_fail, which says why. C only on the way to 0: no objects made."""
    if r == NULL:
        return 1
    cdef ggml_tensor * t = ggml_get_first_tensor(_scratch)
    cdef uint64_t need = 0
    cdef uint64_t headers = 0
    cdef pyggml_status st
    cdef int rc
    while t != NULL:
        need += tensor_bytes(t, ctx.no_alloc)
        headers += _OBJECT_SIZE + _pad(sizeof(ggml_tensor))
        if t.op != GGML_OP_NONE:
            rc = pyggml_check_node(t, &st)
            if rc != PYGGML_OK and rc != PYGGML_UNCHECKED:
                return 1
        t = ggml_get_next_tensor(_scratch, t)
    # objects other than tensors (none today) count as they are
    need += ggml_used_mem(_scratch) - headers
    cdef size_t used = ggml_used_mem(ctx.ptr)
    if used + need > ctx.mem_size:
        return 1
    pg_asan_reserve(ctx.pool.ptr, used, need, ctx.mem_size, &ctx._asan_end)
    return 0


cdef int op_fail(Context ctx, ggml_tensor * r, pyggml_guard * g, str op, tuple names, tuple tensors) except -1:
    """Raise what op_check found: GGMLAbort, the kernel's refusal, or ContextFullError.
    (Called right after op_check, so the scratch context still holds the dry run.)"""
    if r == NULL:
        raise_aborted(g, op, _describe_args(names, tensors))
    cdef ggml_tensor * t = ggml_get_first_tensor(_scratch)
    cdef uint64_t need = 0
    cdef uint64_t headers = 0
    cdef pyggml_status st
    while t != NULL:
        need += tensor_bytes(t, ctx.no_alloc)
        headers += _OBJECT_SIZE + _pad(sizeof(ggml_tensor))
        if t.op != GGML_OP_NONE:
            pyggml_check_node(t, &st)
            raise_status(&st, op, "", names, tensors)
        t = ggml_get_next_tensor(_scratch, t)
    need += ggml_used_mem(_scratch) - headers
    ctx._reserve(need, op)
    raise InternalError(f"{op}: op_check refused a call op_fail finds sound (please report)")


cdef int op_lost(pyggml_guard * g, str op) except -1:
    """The real call aborted after a clean scratch run: cannot happen (same call, same inputs)."""
    raise InternalError(f"{op}: ggml aborted in the real call after a clean scratch run "
                       f"(please report): {g.message.decode('utf-8', 'replace')}")


cdef object version_error(str op, str reason):
    return GGMLVersionError(f"{op}: not available with ggml {c_ggml_version().decode()}: {reason}")


cdef int deprecated(str op) except -1:
    warnings.warn(f"ggml_{op} is deprecated in ggml", DeprecationWarning, stacklevel=2)
    return 0


cdef str short_message(str msg):
    """ggml's abort message without the source path: 'ggml.c:1234: GGML_ASSERT(x) failed'."""
    msg = msg.strip()
    head, sep, tail = msg.partition(": ")
    if sep and ("/" in head or "\\" in head):
        return os.path.basename(head) + ": " + tail
    return msg


cdef str describe(const ggml_tensor * t):
    if t == NULL:
        return "NULL"
    return (f"{ggml_type_name(t.type).decode()} ne=({t.ne[0]}, {t.ne[1]}, {t.ne[2]}, {t.ne[3]}) "
            f"nb=({t.nb[0]}, {t.nb[1]}, {t.nb[2]}, {t.nb[3]})")


cdef str _describe_args(tuple names, tuple tensors):
    cdef Tensor t
    parts = []
    for name, t in zip(names, tensors):
        parts.append(f"{name}: {describe(t.ptr) if t is not None else 'None'}")
    return ("; " + ", ".join(parts)) if parts else ""


cdef str _node_name(const ggml_tensor * t):
    name = ggml_op_name(t.op).decode()
    if t.op == GGML_OP_UNARY:
        name += ":" + ggml_unary_op_name(<ggml_unary_op>t.op_params[0]).decode()
    elif t.op == GGML_OP_GLU:
        name += ":" + ggml_glu_op_name(<ggml_glu_op>t.op_params[0]).decode()
    return name


cdef int check_node(const ggml_tensor * node, str where) except -1:
    """Raise if the CPU kernel of ``node`` would not run on it; 1 when pyggml has no rule
    for its op (the caller proves the graph some other way), else 0."""
    return check_node_named(node, where, (), ())


cdef int check_node_named(const ggml_tensor * node, str where, tuple names, tuple tensors) except -1:
    """check_node, naming the sources that are the given argument tensors."""
    cdef pyggml_status st
    cdef int rc = pyggml_check_node(node, &st)
    raise_status(&st, where, "", names, tensors)
    return 1 if rc == PYGGML_UNCHECKED else 0


def _set_rules_enabled(enabled):
    """_set_rules_enabled(enabled) -> bool  (testing only: see pyggml.opinfo.harness.rules_disabled)

    Disable (or re-enable) pyggml's kernel rules: every node then reads as unchecked, so
    graphs are proven in a guarded forked child before they compute. Returns the
    previous setting."""
    return bool(pyggml_checks_set_enabled(1 if enabled else 0))


def _rules_enabled():
    """_rules_enabled() -> bool: whether pyggml's kernel rules (and bespoke checks) are on."""
    return bool(pyggml_checks_enabled())


def op_is_checked(op, sub_op=0):
    """op_is_checked(op, sub_op=0) -> bool: pyggml has a kernel rule for this GGML_OP
    (and GGML_UNARY_OP/GGML_GLU_OP sub-op) of the linked ggml."""
    return bool(pyggml_op_is_checked(index_arg(op, "op", ""), index_arg(sub_op, "sub_op", "")))


def kernel_trust():
    """kernel_trust() -> {"known": bool, "untrusted": [op, ...], "reviewed": [op, ...],
    "reviewed_in": {op: release}, "pinned_release": release | None}:
    whether the build could fingerprint the linked ggml's CPU kernels (pyggml/_kernels.py:
    a source build), the ops (GGML_OP names) whose kernel is not one their rule was
    written against or reviewed for, and the ops whose kernel is another release's that a
    rule review accepted (trusted, but not the pinned release's kernel), with the release
    that review read, and the release of the pinned kernels: a rule's clauses for a range of
    releases compare the release of the op's kernel. Untrusted ops'
    nodes are proven in a forked child, with a timeout, before they compute: a rule
    cannot vouch for a kernel it has not seen (and a refusal that stands for the old
    kernel's abort leaves the node to that proof). Where the kernels are unknown (a
    prebuilt ggml), no kernel is trusted: every op is listed, and every graph is proven
    before its first compute."""
    names = [ggml_op_name(<ggml_op>i).decode() for i in range(GGML_OP_COUNT)]
    return {"known": bool(pyggml_kernels_known()),
            "untrusted": [n for i, n in enumerate(names) if pyggml_kernel_untrusted(i)],
            "reviewed": [n for i, n in enumerate(names) if pyggml_kernel_reviewed(i)],
            "reviewed_in": {n: _release_name(pyggml_kernel_reviewed(i))
                            for i, n in enumerate(names) if pyggml_kernel_reviewed(i)},
            "pinned_release": _release_name(pyggml_kernels_pinned_release()) if pyggml_kernels_pinned_release()
                              else None}


cdef str _release_name(int number):
    """25003 -> "0.25.3" (csrc/preconditions.h PG_RELEASE)"""
    return f"{number // 1000000}.{number // 1000 % 1000}.{number % 1000}"


def _set_kernel_untrusted(op, flag):
    """_set_kernel_untrusted(op, flag) -> bool (testing only): mark ``op``'s kernel as
    changed (or not); returns the previous mark."""
    rc = pyggml_kernel_set_untrusted(index_arg(op, "op", ""), 1 if flag else 0)
    if rc < 0:
        raise ArgumentError(f"_set_kernel_untrusted: no op {op!r} in the linked ggml")
    return bool(rc)


def _set_kernel_reviewed(op, release):
    """_set_kernel_reviewed(op, release) -> str | None (testing only): mark ``op``'s kernel
    as one a review of ``release`` ("0.25.3") accepted, or as not reviewed (None); returns
    the previous mark. Rules' clauses for newer kernels (csrc pg_kernel_since) follow it."""
    cdef int number = 0
    if release is not None:
        parts = str(release).split(".")
        if len(parts) != 3 or not all(p.isdigit() and len(p) <= 3 for p in parts):
            raise ArgumentError(f"_set_kernel_reviewed: release must read like 0.25.3, not {release!r}")
        number = int(parts[0]) * 1000000 + int(parts[1]) * 1000 + int(parts[2])
    rc = pyggml_kernel_set_reviewed(index_arg(op, "op", ""), number)
    if rc < 0:
        raise ArgumentError(f"_set_kernel_reviewed: no op {op!r} in the linked ggml")
    return _release_name(rc) if rc else None


def rule_entries():
    """rule_entries() -> [(family, op), ...]: every entry of pyggml's kernel-rule tables, in
    table order: the family whose ``csrc/rules_<family>.c`` states the rule, and the op it
    is for, as the op table's ``makes`` column writes it ("ADD", "UNARY:RELU", "GLU:SWIGLU")."""
    cdef const char * family
    cdef const char * name
    cdef int i = 0
    out = []
    while pyggml_rule_entry(i, &family, &name):
        out.append((family.decode(), name.decode()))
        i += 1
    return out


# --- functions that mark tensors (ggml.h; not graph builders) ----------------------------

cdef uint64_t _F32_F16 = (1 << GGML_TYPE_F32) | (1 << GGML_TYPE_F16)


def set_param(t):
    """set_param(t): mark ``t`` as a parameter: graphs with grads compute its gradient.

    ``t`` must be made by new_tensor/from_numpy (op NONE), F32 or F16, and be marked
    before the graph that uses it is expanded.
    """
    cdef Tensor tensor = arg_tensor(t, "t", "set_param")
    if tensor.ptr.op != GGML_OP_NONE:
        raise ArgumentError(f"set_param: t must be an input tensor (op NONE), not the result of {tensor.op}")
    if not (_F32_F16 >> <int>tensor.ptr.type) & 1:
        raise GGMLTypeError(f"set_param: t has type {Type(tensor.ptr.type).name}; supported: F32, F16")
    ggml_set_param(tensor.ptr)


def set_loss(t):
    """set_loss(t): mark the scalar F32 tensor ``t`` as a loss (its gradient starts at 1)."""
    cdef Tensor tensor = arg_tensor(t, "t", "set_loss")
    if tensor.ptr.type != GGML_TYPE_F32:
        raise GGMLTypeError(f"set_loss: t has type {Type(tensor.ptr.type).name}; supported: F32")
    if ggml_nelements(tensor.ptr) != 1:
        raise ArgumentError(f"set_loss: t must be a scalar (1 element), got ne={tensor.ne}")
    ggml_set_loss(tensor.ptr)


def set_output(t):
    """set_output(t): mark ``t`` as an output of the graphs it is in (``ggml_set_output``):
    ggml then writes it whatever it fuses. As in ggml, a tensor computed inside a graph
    is only guaranteed to hold its values if it is an output; ``Graph.build_forward_expand``
    marks the tensor it is given. (The CPU backend fuses RMS_NORM + MUL and never writes
    the RMS_NORM's own result.)"""
    cdef Tensor tensor = arg_tensor(t, "t", "set_output")
    ggml_set_output(tensor.ptr)


def set_input(t):
    """set_input(t): mark ``t`` as an input (``ggml_set_input``), for graph allocators."""
    cdef Tensor tensor = arg_tensor(t, "t", "set_input")
    ggml_set_input(tensor.ptr)


def mul_mat_set_prec(a, prec):
    """mul_mat_set_prec(a, prec): the precision (:class:`Prec`) of a MUL_MAT node ``a``
    (``ggml_mul_mat_set_prec``; the CPU backend computes in F32 either way)."""
    cdef Tensor t = arg_tensor(a, "a", "mul_mat_set_prec")
    cdef int p = arg_enum(prec, Prec, "prec", "mul_mat_set_prec")
    if t.ptr.op != GGML_OP_MUL_MAT:
        raise ArgumentError(f"mul_mat_set_prec: a must be a MUL_MAT node, not {t.op}")
    ggml_mul_mat_set_prec(t.ptr, <ggml_prec>p)


def flash_attn_ext_set_prec(a, prec):
    """flash_attn_ext_set_prec(a, prec): the precision (:class:`Prec`) of a FLASH_ATTN_EXT
    node ``a`` (``ggml_flash_attn_ext_set_prec``)."""
    cdef Tensor t = arg_tensor(a, "a", "flash_attn_ext_set_prec")
    cdef int p = arg_enum(prec, Prec, "prec", "flash_attn_ext_set_prec")
    if ggml_op_name(t.ptr.op).decode() != "FLASH_ATTN_EXT":
        raise ArgumentError(f"flash_attn_ext_set_prec: a must be a FLASH_ATTN_EXT node, not {t.op}")
    ggml_flash_attn_ext_set_prec(t.ptr, <ggml_prec>p)


def prec_set_acc(a, prec):
    """prec_set_acc(a, prec) -> bool: the least accumulator precision (:class:`Prec`) the
    implementation may use for node ``a`` (``ggml_prec_set_acc``, in ggml after 0.20.2, which
    deprecates mul_mat_set_prec and flash_attn_ext_set_prec for it): MUL_MAT and MUL_MAT_ID
    keep it in op_params[0], FLASH_ATTN_EXT in op_params[3]; False (nothing set) for another
    op, as ggml answers. The CPU backend computes in F32 either way.

    GGMLVersionError where the linked ggml lacks it."""
    cdef Tensor t = arg_tensor(a, "a", "prec_set_acc")
    cdef int p = arg_enum(prec, Prec, "prec", "prec_set_acc")
    if not PYGGML_HAVE_PREC_SET:
        raise version_error("prec_set_acc", "ggml_prec_set_acc is newer than this ggml")
    return bool(ggml_prec_set_acc(t.ptr, <ggml_prec>p))


def prec_set_src(a, prec, idx):
    """prec_set_src(a, prec, idx) -> bool: the smallest type rank (:class:`Prec`) the
    implementation may convert source ``idx`` of node ``a`` to (``ggml_prec_set_src``, in ggml
    after 0.20.2): MUL_MAT and MUL_MAT_ID take it for src1 only (op_params[3]); False
    (nothing set) for another op or source, as ggml answers.

    GGMLVersionError where the linked ggml lacks it; ArgumentError for an idx outside
    [0, GGML_MAX_SRC) (ggml asserts it)."""
    cdef Tensor t = arg_tensor(a, "a", "prec_set_src")
    cdef int p = arg_enum(prec, Prec, "prec", "prec_set_src")
    cdef int32_t i = arg_int32(idx, "idx", "prec_set_src")
    if not PYGGML_HAVE_PREC_SET:
        raise version_error("prec_set_src", "ggml_prec_set_src is newer than this ggml")
    if i < 0 or i >= GGML_MAX_SRC:
        raise ArgumentError(f"prec_set_src: idx must be in [0, {GGML_MAX_SRC}), got {i}")
    return bool(ggml_prec_set_src(t.ptr, <ggml_prec>p, i))


def flash_attn_ext_set_n_kv_max(a, n_kv_max):
    """flash_attn_ext_set_n_kv_max(a, n_kv_max): treat the finite entries of a FLASH_ATTN_EXT
    node's mask as a sparse K/V set of at most ``n_kv_max`` per row; 0 turns it off
    (``ggml_flash_attn_ext_set_n_kv_max``, in ggml after 0.20.2). A hint for backends that
    use it: ggml 0.25.3's CPU kernel does not read it (op_params[4]), and computes the same.
    The bound is on the mask's data, which nothing checks here.

    GGMLVersionError where the linked ggml lacks it; ArgumentError for what ggml asserts
    (a node of another op, a negative bound)."""
    cdef Tensor t = arg_tensor(a, "a", "flash_attn_ext_set_n_kv_max")
    cdef int32_t n = arg_int32(n_kv_max, "n_kv_max", "flash_attn_ext_set_n_kv_max")
    if not PYGGML_HAVE_FA_N_KV_MAX:
        raise version_error("flash_attn_ext_set_n_kv_max", "ggml_flash_attn_ext_set_n_kv_max is newer than this ggml")
    if ggml_op_name(t.ptr.op).decode() != "FLASH_ATTN_EXT":
        raise ArgumentError(f"flash_attn_ext_set_n_kv_max: a must be a FLASH_ATTN_EXT node, not {t.op}")
    if n < 0:
        raise ArgumentError(f"flash_attn_ext_set_n_kv_max: n_kv_max must be >= 0, got {n}")
    ggml_flash_attn_ext_set_n_kv_max(t.ptr, n)


cdef object _add_sinks(str what, object a, object sinks, str op, int slot):
    """ggml_soft_max_add_sinks / ggml_flash_attn_ext_add_sinks: what ggml asserts, checked
    first; the node checked against its kernel's rule with the sinks in place before it
    changes; the node's context then keeps the sinks' alive, and every graph looks again
    for tensors without data (a graph built before may now reach the sinks)."""
    global _placement_epoch
    cdef Tensor t = arg_tensor(a, "a", what)
    cdef Tensor s = arg_tensor_or_none(sinks, "sinks", what)
    cdef ggml_tensor probe
    if not PYGGML_HAVE_ADD_SINKS:
        raise version_error(what, f"ggml_{what} is newer than this ggml")
    if ggml_op_name(t.ptr.op).decode() != op:
        raise ArgumentError(f"{what}: a must be a {op} node, not {t.op}")
    if s is None:
        if slot == 2:
            ggml_soft_max_add_sinks(t.ptr, NULL)
        else:
            ggml_flash_attn_ext_add_sinks(t.ptr, NULL)
        return a
    need_open(s.ctx, "sinks")
    if t.ptr.src[slot] != NULL:
        raise ArgumentError(f"{what}: a already has sinks (src{slot}); remove them first with sinks=None")
    if s.ptr.type != GGML_TYPE_F32:
        raise GGMLTypeError(f"{what}: sinks must be F32, not {ggml_type_name(s.ptr.type).decode()}")
    if t.ptr.src[0].ne[2] != s.ptr.ne[0]:
        raise ArgumentError(f"{what}: sinks need one value per head: ne[0] = {s.ptr.ne[0]}, but the node's "
                            f"src0 has ne[2] = {t.ptr.src[0].ne[2]} heads")
    probe = t.ptr[0]                    # the node as it would be (its sources shared)
    probe.src[slot] = s.ptr
    check_node_named(&probe, what, ("sinks",), (s,))
    if slot == 2:
        ggml_soft_max_add_sinks(t.ptr, s.ptr)
    else:
        ggml_flash_attn_ext_add_sinks(t.ptr, s.ptr)
    t.ctx._depend_on(s.ctx)
    _placement_epoch += 1
    return a


def soft_max_add_sinks(a, sinks):
    """soft_max_add_sinks(a, sinks) -> a: attention sinks for a SOFT_MAX node
    (``ggml_soft_max_add_sinks``): each row of head h is normalized as if it had one more
    logit, ``sinks[h]``, that takes its share of the sum and has no output. ``sinks``: F32,
    one value per head (``ne[0]`` = ``a``'s src0 ``ne[2]``); None removes them. ``a`` is
    changed in place and returned; build its graph after this.

    GGMLVersionError where the linked ggml lacks it; ArgumentError for what ggml asserts (a
    node of another op, sinks already set, a head count that differs), GGMLTypeError for
    sinks that are not F32; KernelPreconditionError for sinks the CPU kernel misreads
    (strided). The node is checked with its sinks before it changes: a refusal leaves it as
    it was."""
    return _add_sinks("soft_max_add_sinks", a, sinks, "SOFT_MAX", 2)


def flash_attn_ext_add_sinks(a, sinks):
    """flash_attn_ext_add_sinks(a, sinks) -> a: attention sinks for a FLASH_ATTN_EXT node
    (``ggml_flash_attn_ext_add_sinks``): the softmax over each query's keys gets one more
    logit per head, ``sinks[h]``, with no value. ``sinks``: F32, one value per head
    (``ne[0]`` = q's ``ne[2]``); None removes them. Checked and changed as
    :func:`soft_max_add_sinks` is."""
    return _add_sinks("flash_attn_ext_add_sinks", a, sinks, "FLASH_ATTN_EXT", 4)


def rope_set_offset(a, n_offs):
    """rope_set_offset(a, n_offs) -> a: rotate each row's n_dims elements from element
    ``n_offs`` on, instead of from 0 (``ggml_rope_set_offset``, in ggml after 0.20.2).
    ``a`` is a ROPE or ROPE_BACK node, changed in place and returned.

    GGMLVersionError where the linked ggml lacks it; ArgumentError for what ggml asserts
    (a node of another op, a negative offset, VISION mode); KernelPreconditionError for an
    offset the CPU kernel asserts (odd, or a block that ends past the row). The node is
    checked with its new offset before it changes: a refusal leaves it as it was. (ggml's
    backward pass of ROPE does not carry the offset: defect "rope-offset-grad".)"""
    cdef Tensor t = arg_tensor(a, "a", "rope_set_offset")
    cdef int32_t n = arg_int32(n_offs, "n_offs", "rope_set_offset")
    cdef ggml_tensor probe
    cdef int32_t * params
    if not PYGGML_HAVE_ROPE_SET_OFFSET:
        raise version_error("rope_set_offset", "ggml_rope_set_offset is newer than this ggml")
    if ggml_op_name(t.ptr.op).decode() not in ("ROPE", "ROPE_BACK"):
        raise ArgumentError(f"rope_set_offset: a must be a ROPE or ROPE_BACK node, not {t.op}")
    if n < 0:
        raise ArgumentError(f"rope_set_offset: n_offs must be >= 0, got {n}")
    if (<int32_t *> t.ptr.op_params)[2] == GGML_ROPE_TYPE_VISION:
        raise ArgumentError("rope_set_offset: a VISION rope has no offset (ggml asserts it)")
    probe = t.ptr[0]                    # the node as it would be (its sources shared)
    params = <int32_t *> probe.op_params
    params[15] = n
    check_node(&probe, "rope_set_offset")
    ggml_rope_set_offset(t.ptr, n)
    return a


def mul_mat_set_hint(a, hint):
    """mul_mat_set_hint(a, hint): the hint (:class:`OpHint`) of a MUL_MAT node ``a``
    (``ggml_mul_mat_set_hint``). With ``OpHint.SRC0_IS_HADAMARD`` the CPU kernel takes
    src0 for the normalized Hadamard matrix H_n / sqrt(n) (n = ne00, a power of 2): it
    computes each src1 row's fast Walsh-Hadamard transform and never reads src0's values,
    so the result is src0 @ src1 only where that promise holds (the reference
    implementations, ``use_ref``, ignore the hint and multiply).

    GGMLVersionError where the linked ggml lacks it; ArgumentError for a node of another
    op or a hint ggml does not define; GGMLTypeError for a src1 the Hadamard kernel aborts
    on (F32 only; F16 too from ggml 0.25.3) and KernelPreconditionError for an n it
    aborts on (not a power of 2) or a src0 that is not square (the kernel writes n floats
    to each result row of ne01). The node is checked with its new hint before it changes:
    a refusal leaves it as it was."""
    cdef Tensor t = arg_tensor(a, "a", "mul_mat_set_hint")
    cdef ggml_tensor probe
    if not PYGGML_HAVE_MUL_MAT_SET_HINT:
        raise version_error("mul_mat_set_hint", "ggml_mul_mat_set_hint is newer than this ggml")
    cdef int h = arg_enum(hint, OpHint, "hint", "mul_mat_set_hint")
    if ggml_op_name(t.ptr.op).decode() != "MUL_MAT":
        raise ArgumentError(f"mul_mat_set_hint: a must be a MUL_MAT node, not {t.op}")
    probe = t.ptr[0]                    # the node as it would be (its sources shared)
    (<int32_t *> probe.op_params)[1] = h
    check_node(&probe, "mul_mat_set_hint")
    ggml_mul_mat_set_hint(t.ptr, h)


def linked_op_names():
    """linked_op_names() -> (ops, unary_ops, glu_ops): the names the linked ggml gives its
    ops (``ggml_op_name``, ``ggml_unary_op_name``, ``ggml_glu_op_name``), in enum order."""
    ops = [ggml_op_name(<ggml_op>i).decode() for i in range(GGML_OP_COUNT)]
    unary = [ggml_unary_op_name(<ggml_unary_op>i).decode() for i in range(GGML_UNARY_OP_COUNT)]
    glu = [ggml_glu_op_name(<ggml_glu_op>i).decode() for i in range(GGML_GLU_OP_COUNT)]
    return ops, unary, glu
