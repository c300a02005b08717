"""Shared test machinery: the level-under-test wrapper, closeness checks, input
generators, PyTorch's own modules loaded from the canonical parameters, and a
Triton launch counter.

Nothing here computes an expected value for a level; expected values come from
``reference.py`` (float64 numpy) or from PyTorch's modules.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import torch
from torch import nn

from levels.common import public, semantics
from levels.common.params import subset

LOW_PRECISION = ("float16", "bfloat16")


def pythonpath(*first: object) -> str:
    """A child process's PYTHONPATH: ``first``, then this process's own (kept, so a run
    that hides a package through it, as CI's suite without triton does, hides it there too)."""
    return os.pathsep.join(str(p) for p in (*first, os.environ.get("PYTHONPATH")) if p)


# Gemma 3's architecture at a test's size, one set of options for every file that varies a
# config over the families: heads wider than D / H (head_dim), one KV head, QK-norm, a norm
# after each sublayer, GeGLU (the tanh GELU), gains stored as offsets from 1, and local
# (window 3) and global layers with RoPE bases of their own. With two layers or more, layer
# 0 is local and layer 1 global (window_pattern 2).
# The blocks people run most: Llama's and Qwen2's (RMSNorm, SwiGLU, multi-query attention,
# q/k/v bias only, unscaled and untied embeddings).
LLAMA_OPTIONS = dict(
    norm="rmsnorm",
    ffn="swiglu",
    n_kv_heads=1,
    bias=False,
    qkv_bias=True,
    scale_embeddings=False,
    tie_embeddings=False,
)
GEMMA_OPTIONS = dict(
    head_dim=6,
    n_kv_heads=1,
    norm="rmsnorm",
    ffn="geglu",
    bias=False,
    qk_norm=True,
    post_norms=True,
    norm_weight_offset=1.0,
    window=3,
    window_pattern=2,
    rope_local_base=100.0,
)


@dataclass(frozen=True)
class Policy:
    """How a level is tested: its array framework, its dtypes, its size class."""

    framework: str  # "python", "numpy" or "torch"
    cpu_dtypes: tuple[str, ...]  # most precise first
    cuda_dtypes: tuple[str, ...] | None = None  # None: the level does not use the GPU
    tiny_on_cpu: bool = False  # slow on CPU: keep every shape tiny

    def dtypes(self, device: str) -> tuple[str, ...]:
        if device == "cuda" and self.cuda_dtypes is not None:
            return self.cuda_dtypes
        return self.cpu_dtypes


@dataclass(frozen=True)
class Tolerance:
    """``|x - ref| <= atol + rtol * |ref|``; with ``baseline_factor``, the flash-attention
    rule ``max|x - ref| <= factor * max|torch - ref| + atol`` instead."""

    atol: float
    rtol: float
    baseline_factor: float | None = None


def _describe_failure(actual, expected, bound, what) -> str:
    err = np.abs(actual - expected)
    excess = err - bound
    idx = np.unravel_index(int(np.argmax(excess)), err.shape) if err.ndim else ()
    return (
        f"{what} {err.shape}: {int((excess > 0).sum())} of {err.size} elements out of tolerance; "
        # 15 significant digits: the reference's last bits depend on the BLAS's order of
        # summation (threads, machine), and the difference itself is printed below
        f"worst at {tuple(int(i) for i in idx)}: got {float(actual[idx]):.15g}, expected "
        f"{float(expected[idx]):.15g} "
        f"(|diff| {err[idx]:.3e} > bound {np.broadcast_to(bound, err.shape)[idx]:.3e}); "
        f"max |diff| {err.max():.3e}"
    )


def assert_allclose_tol(actual, expected, tol: Tolerance, *, what="output", baseline=None):
    """Check ``actual`` against the float64 ``expected`` with tolerance ``tol``.

    For low-precision dtypes ``baseline`` must be PyTorch's own result in the same
    dtype; the level may then be at most ``tol.baseline_factor`` times worse.
    """
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    finite = np.isfinite(actual)
    if not finite.all():
        first = tuple(int(i) for i in np.argwhere(~finite)[0])
        raise AssertionError(
            f"{what} {actual.shape}: {int((~finite).sum())} of {actual.size} values not finite, "
            f"the first at {first}: {float(actual[first])!r} (expected {float(expected[first])!r})"
        )
    if tol.baseline_factor is not None:
        if baseline is None:
            raise AssertionError(f"{what}: a low-precision check needs PyTorch's own result")
        baseline = np.asarray(baseline, dtype=np.float64)
        err = float(np.abs(actual - expected).max())
        torch_err = float(np.abs(baseline - expected).max())
        limit = tol.baseline_factor * torch_err + tol.atol
        assert err <= limit, (
            f"{what}: max error {err:.3e} exceeds {tol.baseline_factor} x PyTorch's own "
            f"{torch_err:.3e} + {tol.atol:.1e}"
        )
        return
    bound = tol.atol + tol.rtol * np.abs(expected)
    if not (np.abs(actual - expected) <= bound).all():
        raise AssertionError(_describe_failure(actual, expected, bound, what))


@dataclass
class Case:
    """One level, in one dtype, on one device: converts arrays and builds pieces."""

    name: str
    module: ModuleType
    dtype: str
    device: str
    policy: Policy
    tolerance: Tolerance

    def __str__(self) -> str:
        return f"{self.name}[{self.dtype}]"

    @property
    def is_torch(self) -> bool:
        return self.policy.framework == "torch"

    @property
    def tiny(self) -> bool:
        """True where the level is slow (pure Python, the Triton interpreter)."""
        return self.policy.tiny_on_cpu and (self.device == "cpu" or not self.is_torch)

    @property
    def low_precision(self) -> bool:
        return self.dtype in LOW_PRECISION

    @property
    def native_dtype(self):
        if self.policy.framework == "python":
            return None
        if self.policy.framework == "numpy":
            return np.dtype(self.dtype)
        return getattr(torch, self.dtype)

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def _device_kw(self) -> dict:
        return {"device": self.device} if self.is_torch else {}

    def arr(self, x) -> object:
        """A numpy array in the level's native type; floats take the case's dtype."""
        x = np.asarray(x)
        if np.issubdtype(x.dtype, np.floating):
            return self.module.asarray(x, dtype=self.native_dtype, **self._device_kw())
        return self.module.asarray(x, **self._device_kw())

    def np(self, x) -> np.ndarray:
        """A native array back to numpy (float64 for floats, for comparisons)."""
        if self.is_torch and isinstance(x, torch.Tensor) and x.requires_grad:
            x = x.detach()
        out = np.asarray(self.module.to_numpy(x))
        return out.astype(np.float64) if np.issubdtype(out.dtype, np.floating) else out

    def sees(self, valid, window=None, *, causal=True) -> tuple:
        """A block's self-attention inputs over the right-padded ``valid (B,T)``, in the level's
        arrays: the tokens' positions ``(B,T)`` and what each query may see ``(B,1,T,T)``,
        made as the models make them (``public.positions_of``, ``semantics.visible``)."""
        positions = public.positions_of(np.asarray(valid))
        mask = semantics.visible(positions, positions, window, causal=causal)
        return self.arr(positions), self.arr(mask)

    def attention(self, mha, x, kv=None, *, mask=None, positions=None) -> object:
        """A ``MultiHeadAttention`` piece on numpy inputs: self-attention of ``x (B,T,D)`` at
        ``positions (B,T)`` (None: unrotated), or cross-attention to ``kv (B,S,D)``; ``mask``
        broadcastable to ``(B,H,T,S)``, True = may attend."""
        mask = None if mask is None else self.arr(mask)
        if kv is not None:
            return mha.attend(mha.queries(self.arr(x)), *mha.keys_values(self.arr(kv)), mask)
        return mha(self.arr(x), None if positions is None else self.arr(positions), mask)

    def cross(self, valid, memory_valid) -> object:
        """What each target query ``valid (B,T)`` may see of a source ``memory_valid (B,S)``:
        ``(B,1,T,S)`` in the level's arrays, as the seq2seq models make it."""
        q, k = (public.positions_of(np.asarray(v)) for v in (valid, memory_valid))
        return self.arr(semantics.visible(q, k, causal=False))

    def build(self, cls_name: str, config, params, **kwargs):
        """``module.<cls_name>(config, params, ...)`` in the case's dtype and device."""
        cls = getattr(self.module, cls_name)
        kw = dict(kwargs)
        if self.policy.framework != "python":
            kw["dtype"] = self.native_dtype
        kw.update(self._device_kw())
        return cls(config, params, **kw)

    def assert_close(self, actual, expected, *, what="output", baseline=None):
        """``actual`` (native or numpy) against the float64 ``expected``, with the case's tolerance.

        At a numpy level (level 1, a learner's rung) ``actual`` must be a numpy array: a
        list would pass the comparison here and break the next piece (``+`` joins lists).
        """
        if self.policy.framework == "numpy" and not isinstance(actual, np.ndarray):
            raise AssertionError(f"{self} {what}: a {type(actual).__name__}, not a numpy array")
        if not isinstance(actual, np.ndarray):
            actual = self.np(actual)
        assert_allclose_tol(
            actual, expected, self.tolerance, what=f"{self} {what}", baseline=baseline
        )


# ---------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------


def random_mask(rng: np.random.Generator, shape, *, p=0.6) -> np.ndarray:
    """A boolean mask of ``shape (..., T, S)`` with at least one True per row."""
    mask = rng.random(shape) < p
    S = shape[-1]
    rows = mask.reshape(-1, S)
    keep = rng.integers(0, S, rows.shape[0])
    rows[np.arange(rows.shape[0]), keep] = True
    return rows.reshape(shape)


def small_config(tiny: bool, **overrides):
    """A tiny model for the slow levels (``case.tiny``), a small one elsewhere."""
    from levels import TransformerConfig

    base = (
        dict(vocab_size=13, d_model=8, n_heads=2, d_ff=12, n_layers=1, max_seq_len=12)
        if tiny
        else dict(vocab_size=31, d_model=16, n_heads=2, d_ff=24, n_layers=2, max_seq_len=24)
    )
    return TransformerConfig(**(base | overrides))


DISCRIMINATING_SCALE = 4.0  # the random scheme's matrices times this: see below


def discriminating_params(config, seed: int = 1) -> dict[str, np.ndarray]:
    """Parameters of a toy model that can tell a right answer from a wrong one: ``config``
    must be untied (``tie_embeddings=False``), and every matrix of the random scheme is
    scaled by ``DISCRIMINATING_SCALE``. Tied, and at the random scheme's small scale, a
    toy model's greedy text repeats its prompt's last token, so a guess, a slot or a
    position that is wrong seldom changes a token; untied and scaled, the greedy tokens
    depend on every token and every position of the prompt (tests/test_engine.py holds
    that), and a mistake shows in the text."""
    from levels import init_params

    if config.tie_embeddings:
        raise ValueError("a discriminating toy model is untied: tie_embeddings=False")
    params = init_params(config, "decoder_only", seed=seed, scheme="random")
    return {k: DISCRIMINATING_SCALE * v if v.ndim == 2 else v for k, v in params.items()}


def right_padded(lengths, T: int) -> np.ndarray:
    """``valid (B, T)``: row ``b`` has ``lengths[b]`` real tokens, then padding."""
    return np.arange(T)[None, :] < np.asarray(lengths)[:, None]


def random_tokens(rng, config, B, T, *, valid=None) -> np.ndarray:
    """Token ids ``(B, T)`` avoiding the pad id; ``pad_id`` where ``valid`` is False."""
    tokens = rng.integers(1, config.vocab_size, (B, T))
    tokens = np.where(tokens == config.pad_id, config.vocab_size - 1, tokens)
    if valid is not None:
        tokens = np.where(valid, tokens, config.pad_id)
    return tokens.astype(np.int64)


# ---------------------------------------------------------------------------
# PyTorch's own modules, loaded with the canonical parameters by name
# ---------------------------------------------------------------------------


def _tensors(params, prefix, dtype, device):
    return {
        name: torch.as_tensor(value, dtype=dtype, device=device)
        for name, value in subset(params, prefix).items()
    }


def _load(module: nn.Module, params, prefix, dtype, device) -> nn.Module:
    module = module.to(dtype=dtype, device=device)
    module.load_state_dict(_tensors(params, prefix, dtype, device), strict=True)
    # Stay in eval mode but keep grad enabled on the parameters: that keeps
    # PyTorch off its fused "fast path", which is a different implementation.
    return module.eval()


def torch_mha(config, params, prefix, *, dtype=torch.float64, device="cpu"):
    m = nn.MultiheadAttention(config.d_model, config.n_heads, bias=config.bias, batch_first=True)
    return _load(m, params, prefix, dtype, device)


def _layer_kwargs(config):
    return dict(
        d_model=config.d_model,
        nhead=config.n_heads,
        dim_feedforward=config.d_ff,
        dropout=0.0,
        activation="gelu",
        layer_norm_eps=config.norm_eps,
        batch_first=True,
        norm_first=True,
        bias=config.bias,
    )


def torch_encoder_layer(config, params, prefix, *, dtype=torch.float64, device="cpu"):
    return _load(nn.TransformerEncoderLayer(**_layer_kwargs(config)), params, prefix, dtype, device)


def torch_decoder_layer(config, params, prefix, *, dtype=torch.float64, device="cpu"):
    return _load(nn.TransformerDecoderLayer(**_layer_kwargs(config)), params, prefix, dtype, device)


def torch_layer_norm(config, params, prefix, *, dtype=torch.float64, device="cpu"):
    m = nn.LayerNorm(config.d_model, eps=config.norm_eps, bias=config.bias)
    return _load(m, params, prefix, dtype, device)


class TorchFeedForward(nn.Module):
    """``linear2(GELU(linear1(x)))`` from PyTorch's modules, named as in the canonical dict."""

    def __init__(self, config):
        super().__init__()
        self.linear1 = nn.Linear(config.d_model, config.d_ff, bias=config.bias)
        self.linear2 = nn.Linear(config.d_ff, config.d_model, bias=config.bias)

    def forward(self, x):
        return self.linear2(nn.functional.gelu(self.linear1(x)))  # exact (erf) GELU


def torch_feed_forward(config, params, prefix, *, dtype=torch.float64, device="cpu"):
    """The FFN of the block under ``prefix`` (e.g. ``"decoder.layers.0."``)."""
    ffn = {
        n: v for n, v in params.items() if n.startswith((prefix + "linear1.", prefix + "linear2."))
    }
    return _load(TorchFeedForward(config), ffn, prefix, dtype, device)


def _t(x, dtype, device):
    return torch.as_tensor(np.asarray(x), dtype=dtype, device=device)


def torch_bottom_right_disallowed(T, S, device="cpu"):
    """PyTorch's bool attn_mask convention is True = NOT allowed; bottom-right causal."""
    i = torch.arange(T, device=device)[:, None]
    j = torch.arange(S, device=device)[None, :]
    return j > i + (S - T)


class TorchSeq2Seq(nn.Module):
    """The seq2seq model (positional none) around PyTorch's own ``nn.Transformer``.

    The embeddings (scaled by sqrt(D)) and the output projection are ours:
    PyTorch's module starts after the embedding and stops before the vocabulary.
    Its state dict has exactly the canonical names.
    """

    def __init__(self, config):
        super().__init__()
        self.d_model = config.d_model
        self.source_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.target_embedding = nn.Embedding(config.vocab_size, config.d_model)
        kw = _layer_kwargs(config)
        with warnings.catch_warnings():
            # norm_first=True turns off the nested-tensor path, and PyTorch warns about it.
            warnings.simplefilter("ignore", UserWarning)
            self.transformer = nn.Transformer(
                num_encoder_layers=config.n_layers, num_decoder_layers=config.n_layers, **kw
            )
        # Re-home the stacks so the state dict reads encoder.* / decoder.*, not transformer.*.
        self.encoder = self.transformer.encoder
        self.decoder = self.transformer.decoder
        del self.transformer
        self.output_projection = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def forward(self, src, tgt, src_valid, tgt_valid):
        """``src (B,S)``, ``tgt (B,T)`` ids, bool valid masks -> logits ``(B,T,V)``."""
        scale = self.d_model**0.5
        src_pad, tgt_pad = ~src_valid, ~tgt_valid  # key_padding_mask: True = ignore
        T = tgt.shape[1]
        memory = self.encoder(self.source_embedding(src) * scale, src_key_padding_mask=src_pad)
        h = self.decoder(
            self.target_embedding(tgt) * scale,
            memory,
            tgt_mask=torch_bottom_right_disallowed(T, T, tgt.device),
            tgt_key_padding_mask=tgt_pad,
            memory_key_padding_mask=src_pad,
        )  # (B,T,D)
        return self.output_projection(h).masked_fill(tgt_pad[..., None], 0.0)  # (B,T,V)


class TorchDecoderOnly(nn.Module):
    """The decoder-only model (positional none) as causal ``nn.TransformerEncoderLayer``s."""

    def __init__(self, config):
        super().__init__()
        self.d_model = config.d_model
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(**_layer_kwargs(config)) for _ in range(config.n_layers)
        )
        self.norm = nn.LayerNorm(config.d_model, eps=config.norm_eps, bias=config.bias)

    def forward(self, tokens, valid):
        """``tokens (B,T)``, ``valid (B,T)`` -> logits ``(B,T,V)``, tied to the embedding."""
        x = self.token_embedding(tokens) * self.d_model**0.5  # (B,T,D)
        T = tokens.shape[1]
        pad = ~valid
        causal = torch_bottom_right_disallowed(T, T, tokens.device)
        for layer in self.layers:
            x = layer(x, src_mask=causal, src_key_padding_mask=pad)
        logits = self.norm(x) @ self.token_embedding.weight.T  # (B,T,D) @ (D,V) -> (B,T,V)
        return logits.masked_fill(pad[..., None], 0.0)


def torch_model(config, params, kind, *, dtype=torch.float64, device="cpu") -> nn.Module:
    """PyTorch's own model of ``kind`` with the canonical parameters loaded by name."""
    m = TorchDecoderOnly(config) if kind == "decoder_only" else TorchSeq2Seq(config)
    return _load(m, params, "", dtype, device)


def torch_seq2seq_logits(config, params, src, tgt, src_valid, tgt_valid, *, dtype, device="cpu"):
    """Seq2seq logits ``(B,T,V)`` as float64 numpy, computed by ``TorchSeq2Seq``."""
    model = torch_model(config, params, "seq2seq", dtype=dtype, device=device)
    ids = [_t(a, torch.long, device) for a in (src, tgt)]
    masks = [_t(a, torch.bool, device) for a in (src_valid, tgt_valid)]
    return model(*ids, *masks).detach().to("cpu", torch.float64).numpy()


def torch_decoder_only_logits(config, params, tokens, valid, *, dtype, device="cpu"):
    """Decoder-only logits ``(B,T,V)`` as float64 numpy, computed by ``TorchDecoderOnly``."""
    model = torch_model(config, params, "decoder_only", dtype=dtype, device=device)
    out = model(_t(tokens, torch.long, device), _t(valid, torch.bool, device))
    return out.detach().to("cpu", torch.float64).numpy()


def torch_sdpa_math(q, k, v, *, causal=False, mask=None, scale=None, dtype, device="cpu"):
    """SDPA's math backend; our bool mask (True = may attend) is also SDPA's convention."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (_t(a, dtype, device) for a in (q, k, v))
    T, S = q.shape[-2], k.shape[-2]
    allowed = torch.ones(T, S, dtype=torch.bool, device=device)
    if causal:
        allowed = allowed & ~torch_bottom_right_disallowed(T, S, device)
    if mask is not None:
        allowed = allowed & _t(mask, torch.bool, device)
    with sdpa_kernel(SDPBackend.MATH):
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, scale=scale
        )
    return out.to("cpu", torch.float64).numpy()


# ---------------------------------------------------------------------------
# Triton launches (level 4): errors must be raised before any kernel runs
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def count_kernel_launches():
    """Count Triton kernel launches (compiled or interpreted) inside the block.

    Yields a one-element list holding the count. Without triton it counts nothing.
    """
    count = [0]
    patched = []
    try:
        import triton.runtime.jit as jit

        classes = [jit.JITFunction]
        try:
            import triton.runtime.interpreter as interp

            classes.append(interp.InterpretedFunction)
        except ImportError:  # pragma: no cover - older triton
            pass
    except ImportError:
        classes = []
    for cls in classes:
        original = cls.run

        def counting(self, *args, _original=original, **kwargs):
            count[0] += 1
            return _original(self, *args, **kwargs)

        cls.run = counting
        patched.append((cls, original))
    try:
        yield count
    finally:
        for cls, original in patched:
            cls.run = original
