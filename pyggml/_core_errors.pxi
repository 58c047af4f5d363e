# The error funnel: every outcome of pyggml's C runtime reaches Python as one record
# (pyggml_status, csrc/status.c) and becomes an exception here, from one table. Nothing
# else in pyggml maps a C code to an exception class. (Included by _core.pyx.)

import errno as _errno

# code -> (the class, its message, what the class takes besides the message).
# Fields of a message: where (the caller's name for what it did), msg (the record's
# words), how (its number), detail (the caller's addition).
_STATUS_TABLE = {
    PYGGML_REFUSED: (KernelPreconditionError, "{where}: {msg}{detail}", "op"),
    PYGGML_REFUSED_TYPE: (GGMLTypeError, "{where}: {msg}{detail}", None),
    PYGGML_DEFECT: (UpstreamDefect, "{where}: {msg}{detail}", "defect"),
    PYGGML_BAD_INDEX: (ArgumentError, "{where}: {msg} (the nodes before it have run){detail}", None),
    PYGGML_NO_SEGMENTS: (GGMLVersionError, "{where}: {msg}{detail}", None),
    PYGGML_ABORTED: (GGMLAbort, "{where}: ggml would abort: {short}{detail}", "ggml_message"),
    PYGGML_CRASHED: (GGMLAbort, "{where}: ggml would crash: {msg}{detail}", "ggml_message"),
    PYGGML_PROOF_SIGNAL: (GGMLAbort, "{where}: ggml would abort (signal {how}): {msg_or_none}{detail}",
                          "ggml_message"),
    PYGGML_PROOF_EXIT: (GGMLAbort, "{where}: ggml would abort (exit {how}): {msg_or_none}{detail}", "ggml_message"),
    PYGGML_PROOF_TIMEOUT: (KernelTimeout, "{where}: the kernel did not finish in the proof's {how} s (a hang, or "
                                          "a kernel far slower than a proof allows): "
                                          "{msg_or_none}{detail}", "timeout"),
    PYGGML_SYSTEM: (OSError, "{where}: the forked proof could not run ({msg}){detail}", "errno"),
    PYGGML_COMPUTE_FAILED: (ComputeError, "{where}: ggml's compute failed: {msg}{detail}", "status"),
    PYGGML_OUT_OF_MEMORY: (ContextFullError, "{where}: ggml ran out of memory ({msg}){detail}", None),
    PYGGML_CXX_EXCEPTION: (ContextFullError, "{where}: ggml ran out of memory ({msg}){detail}", None),
    PYGGML_LACKS: (GGMLVersionError, "{where}: {msg}{detail}", None),
    PYGGML_NO_BACKWARD: (UnsupportedOpError, "{where}: {msg}{detail}", "node"),
    PYGGML_BAD_FILE: (GGUFError, "{where}: ggml's reader refuses it: {msg}{detail}", None),
}


cdef int raise_status(pyggml_status * st, str where, str detail="", tuple names=(),
                      tuple tensors=()) except -1:
    """Raise the exception of a C outcome (nothing for PYGGML_OK and PYGGML_UNCHECKED,
    which are not failures). ``where``: the public call it happened in; ``detail``
    follows the message; ``names``/``tensors``: the caller's argument tensors, so that a
    refused node's message says which of them are its sources."""
    if st.code == PYGGML_OK or st.code == PYGGML_UNCHECKED:
        return 0
    entry = _STATUS_TABLE.get(st.code)
    if entry is None:
        raise InternalError(f"{where}: pyggml's C runtime reported code {st.code}, which pyggml does not know "
                            f"(please report): {st.msg.decode('utf-8', 'replace')}")
    cls, template, extra = entry
    msg = st.msg.decode("utf-8", "replace").strip()
    if st.node != NULL:
        msg = _refused_node(st.node, msg, names, tensors)
    # a proof's time limit is counted in milliseconds, and said in seconds
    how = f"{st.how / 1000:g}" if extra == "timeout" else st.how
    text = template.format(where=where, msg=msg, how=how, detail=detail, short=short_message(msg),
                           msg_or_none=msg or "no message")
    if extra is None:
        raise cls(text)
    if extra == "op":
        raise cls(text, _node_name(st.node) if st.node != NULL else "")
    if extra == "node":
        raise cls(text, op=_node_name(st.node) if st.node != NULL else "",
                  node=st.node.name.decode("utf-8", "replace") if st.node != NULL else "")
    if extra == "defect":
        raise cls(text, st.defect.decode() if st.defect != NULL else "")
    if extra == "ggml_message":
        raise cls(text, msg)
    if extra == "errno":
        raise cls(st.how or _errno.EIO, text)
    if extra == "status":
        raise cls(text, msg)
    if extra == "timeout":
        raise cls(text, msg, st.how / 1000)
    raise InternalError(f"{where}: the error table's entry for code {st.code} is malformed (please report)")


cdef str _refused_node(const ggml_tensor * node, str msg, tuple names, tuple tensors):
    """A refused node's message: its op, why, which argument tensors are its sources, the
    node and its sources' types and layouts."""
    cdef Tensor t
    cdef int i
    roles = []
    for i in range(GGML_MAX_SRC):
        for name, t in zip(names, tensors):
            if t is not None and node.src[i] == t.ptr:
                roles.append(f"src{i} is {name}")
    srcs = ", ".join(f"src{i}: {describe(node.src[i])}" for i in range(GGML_MAX_SRC) if node.src[i] != NULL)
    roles_text = f" ({'; '.join(roles)})" if roles else ""
    return f"{_node_name(node)} node refused: {msg}{roles_text}. Node: {describe(node)}; {srcs}"


cdef str guard_logged(const pyggml_guard * g):
    """" (ggml logged: ...)" with what ggml logged during a guarded call that returned a
    failure of its own (no abort: raise_aborted's message has it already), or ""."""
    cdef char buf[512]
    pyggml_guard_logged(g, buf, sizeof(buf))
    text = buf.decode("utf-8", "replace")
    return f" (ggml logged: {text})" if text else ""


cdef int raise_aborted(pyggml_guard * g, str where, str detail) except -1:
    """Raise GGMLAbort for a guarded call that aborted (or faulted: g.signal)."""
    cdef pyggml_status st
    pyggml_status_from_guard(&st, g)
    return raise_status(&st, where, detail)


_STATUS_CODES = {
    "PYGGML_OK": PYGGML_OK, "PYGGML_REFUSED": PYGGML_REFUSED, "PYGGML_UNCHECKED": PYGGML_UNCHECKED,
    "PYGGML_REFUSED_TYPE": PYGGML_REFUSED_TYPE, "PYGGML_DEFECT": PYGGML_DEFECT,
    "PYGGML_BAD_INDEX": PYGGML_BAD_INDEX, "PYGGML_NO_SEGMENTS": PYGGML_NO_SEGMENTS,
    "PYGGML_ABORTED": PYGGML_ABORTED, "PYGGML_CRASHED": PYGGML_CRASHED,
    "PYGGML_PROOF_SIGNAL": PYGGML_PROOF_SIGNAL, "PYGGML_PROOF_EXIT": PYGGML_PROOF_EXIT,
    "PYGGML_PROOF_TIMEOUT": PYGGML_PROOF_TIMEOUT, "PYGGML_SYSTEM": PYGGML_SYSTEM,
    "PYGGML_COMPUTE_FAILED": PYGGML_COMPUTE_FAILED, "PYGGML_OUT_OF_MEMORY": PYGGML_OUT_OF_MEMORY,
    "PYGGML_CXX_EXCEPTION": PYGGML_CXX_EXCEPTION, "PYGGML_LACKS": PYGGML_LACKS,
    "PYGGML_NO_BACKWARD": PYGGML_NO_BACKWARD, "PYGGML_BAD_FILE": PYGGML_BAD_FILE,
}


def _status_codes():
    """_status_codes() -> ({name: code} of the C runtime's outcomes, PYGGML_CODE_COUNT)
    (testing: the funnel's table must cover every failure code)."""
    return dict(_STATUS_CODES), PYGGML_CODE_COUNT


def _raise_for_status(int code, int how=0, str msg="", defect=None, str where="test"):
    """_raise_for_status(code, how=0, msg="", defect=None, where="test")  (testing only)

    Raise what the funnel raises for a record of these fields (no node): every code's
    exception, without making ggml fail that way."""
    cdef pyggml_status st
    cdef bytes b = msg.encode()[:PYGGML_MSG_CAP - 1]
    cdef bytes d = defect.encode() if defect is not None else b""
    pyggml_status_clear(&st)
    st.code = code
    st.how = how
    memcpy(st.msg, <const char *>b, len(b))
    st.msg[len(b)] = 0
    st.defect = <const char *>d if defect is not None else NULL
    return raise_status(&st, where)
