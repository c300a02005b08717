"""The model scenarios: the decoder-only model forward, generating, batching and training.

Each is a small frozen dataclass that knows its size and its FLOPs without
building anything (so the runner applies the size budget first), and whose
``build(subject, dtype, reference)`` makes a ``Case``: the callable to time,
inputs already native, and its check against the float64 reference. Scenario
names (the ``scenario`` field of every record):

* ``decoder fwd``: one forward of the decoder-only model over ``(B, T)`` tokens;
* ``generate cached`` / ``generate uncached``: greedy generation from a prompt,
  with and without the KV cache (tokens/s counts new tokens; GB/s the bytes a
  cached generation reads, weights and cache, per second);
* ``generate batched`` / ``generate one at a time``: prompts of different
  lengths right-padded into one batch, or each generated alone;
* ``generate llama``: a Llama-shaped model (RMSNorm, SwiGLU, RoPE) beside
  Hugging Face ``transformers``' own ``generate`` on the same weights;
* ``varlen padded`` / ``varlen bucketed``: a batch of sequences of mixed
  lengths, batched in arrival order or by length (tokens/s counts real tokens);
* ``train step``: one optimisation step of the decoder-only model (loss,
  gradients, clipping, AdamW) through the training lab's backend (tokens/s
  counts the batch's tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from levels.common.bucketing import make_batches, pad_batch, padding_waste
from levels.common.config import TransformerConfig
from levels.common.params import init_params

from . import flops as F
from .reference import Case, Reference, error_bound, scaled_error, token_bound
from .subjects import Subject

FIRST_TOKEN = 3  # random tokens avoid pad 0, BOS 1 and EOS 2


def _model(
    subject: Subject, config: TransformerConfig, seed: int, dtype: str
) -> tuple[dict[str, np.ndarray], Any]:
    """The canonical parameters of ``seed`` and the level's decoder-only model built from them."""
    params = init_params(config, "decoder_only", seed)
    kwargs: dict[str, Any] = {"device": subject.device}
    if subject.kind != "python":
        kwargs["dtype"] = subject.native_dtype(dtype)  # level 0 takes no dtype
    return params, subject.module.DecoderOnlyTransformer(config, params, **kwargs)


def _random_tokens(rng: np.random.Generator, config: TransformerConfig, shape) -> np.ndarray:
    return rng.integers(FIRST_TOKEN, config.vocab_size, size=shape, dtype=np.int64)


def _needs_models(subject: Subject) -> str | None:
    return None if subject.models else "attention only"


@dataclass(frozen=True)
class DecoderForward:
    """One decoder-only forward over ``tokens (B, T)``, every position real."""

    config: TransformerConfig
    B: int
    T: int
    seed: int = 0

    @property
    def scenario(self) -> str:
        return "decoder fwd"

    def shape(self) -> dict[str, int]:
        c = self.config
        return {"B": self.B, "T": self.T, "D": c.d_model, "L": c.n_layers, "V": c.vocab_size}

    def flops(self) -> float:
        return F.decoder_forward_flops(self.config, self.B, self.T)

    def tokens(self) -> int:
        return self.B * self.T

    def unsupported(self, subject: Subject) -> str | None:
        return _needs_models(subject)

    def build(self, subject: Subject, dtype: str, reference: Reference) -> Case:
        params, model = _model(subject, self.config, self.seed, dtype)
        tokens64 = _random_tokens(np.random.default_rng(self.seed), self.config, (self.B, self.T))
        tokens = subject.asarray(tokens64)
        fn = subject.calls(lambda: model.forward(tokens), grad=False)

        def error() -> float:
            want = reference.decoder_logits(self.config, params, dtype, [tokens64])[0]
            return scaled_error(subject.to_numpy(fn()), want)

        return Case(fn=fn, error=error, error_of="logits", bound=error_bound(dtype))


@dataclass(frozen=True)
class Generate:
    """Greedy generation of ``new_tokens`` after a ``(B, prompt)`` prefix.

    With ``lengths``, ``B`` prompts of those lengths: right-padded to the longest
    in one batch (``valid``), or each generated alone (``one_at_a_time``). A
    ``label`` names a scenario of its own (the comparison with a peer).
    """

    config: TransformerConfig
    B: int
    prompt: int
    new_tokens: int
    use_cache: bool
    seed: int = 0
    lengths: tuple[int, ...] | None = None
    one_at_a_time: bool = False
    label: str = ""

    @property
    def scenario(self) -> str:
        if self.label:
            return self.label
        if self.lengths is not None:
            return "generate one at a time" if self.one_at_a_time else "generate batched"
        return "generate cached" if self.use_cache else "generate uncached"

    def _rows(self) -> list[int]:
        """The prompt length of every row."""
        return list(self.lengths) if self.lengths is not None else [self.prompt] * self.B

    def shape(self) -> dict[str, int]:
        c = self.config
        shape = {"B": self.B, "P": self.prompt, "new": self.new_tokens}
        if self.lengths is not None:
            shape["Pmin"] = min(self.lengths)
        return shape | {"T": self.prompt + self.new_tokens, "D": c.d_model, "L": c.n_layers}

    def _per_call(self, per_batch) -> float:
        """A figure of one call: of the whole batch, or summed over rows one at a time."""
        if self.one_at_a_time:
            return sum(per_batch(1, P) for P in self._rows())
        return per_batch(self.B, self.prompt)

    def flops(self) -> float:
        n, cache = self.new_tokens, self.use_cache
        return self._per_call(
            lambda B, P: F.generation_flops(self.config, B, P, n, use_cache=cache)
        )

    def bytes_read(self, dtype: str) -> float | None:
        """What cached generation reads from memory (None without the cache)."""
        if not self.use_cache:
            return None
        n, size = self.new_tokens, F.element_bytes(dtype)
        return self._per_call(lambda B, P: F.generation_bytes(self.config, B, P, n, size))

    def tokens(self) -> int:
        return self.B * self.new_tokens  # tokens/s counts generated tokens

    def unsupported(self, subject: Subject) -> str | None:
        return _needs_models(subject)

    def build(self, subject: Subject, dtype: str, reference: Reference) -> Case:
        params, model = _model(subject, self.config, self.seed, dtype)
        rng = np.random.default_rng(self.seed)
        rows = self._rows()
        valid64 = np.arange(self.prompt)[None, :] < np.array(rows)[:, None]  # (B, P)
        prefix64 = _random_tokens(rng, self.config, (self.B, self.prompt))
        prefix64 = np.where(valid64, prefix64, self.config.pad_id)
        n, cache = self.new_tokens, self.use_cache
        if self.one_at_a_time:
            singles = [subject.asarray(prefix64[b : b + 1, :P]) for b, P in enumerate(rows)]

            def run():
                return [model.generate(one, n, use_cache=cache) for one in singles]

        else:
            prefix = subject.asarray(prefix64)
            ragged = {} if self.lengths is None else {"valid": subject.asarray(valid64)}

            def run():
                return model.generate(prefix, n, use_cache=cache, **ragged)

        fn = subject.calls(run, grad=False)

        def error() -> float:
            out = fn()
            if self.one_at_a_time:
                got = [subject.to_numpy(x)[0] for x in out]
            else:
                full = subject.to_numpy(out).astype(np.int64)
                got = [full[b, : P + n] for b, P in enumerate(rows)]
            # The reference generates each row alone: a batched row must equal it.
            want = [
                reference.generate(self.config, params, dtype, prefix64[b : b + 1, :P], n)[0]
                for b, P in enumerate(rows)
            ]
            return float(sum(np.count_nonzero(g != w) for g, w in zip(got, want, strict=True)))

        return Case(
            fn=fn,
            error=error,
            error_of="tokens != ref",
            bound=token_bound(dtype, self.B * n),
            extras={"bytes_read": self.bytes_read(dtype)},
        )


@dataclass(frozen=True)
class VarlenBatch:
    """Decoder forwards over sequences of mixed lengths, batched as they come or by length.

    ``lengths`` are drawn once from ``seed``; the batches come from
    ``levels.common.bucketing.make_batches`` (``bucketed`` True or False) and
    each batch is right-padded to its longest sequence by ``pad_batch``.
    """

    config: TransformerConfig
    lengths: tuple[int, ...]
    batch_size: int
    bucketed: bool
    seed: int = 0

    @property
    def scenario(self) -> str:
        return "varlen bucketed" if self.bucketed else "varlen padded"

    def batches(self) -> list[list[int]]:
        return make_batches(
            self.lengths, batch_size=self.batch_size, bucketed=self.bucketed, seed=self.seed
        )

    def padded_shapes(self) -> list[tuple[int, int]]:
        """``(B_b, T_b)`` of every padded batch: the work actually done."""
        return [(len(b), max(self.lengths[i] for i in b)) for b in self.batches()]

    def shape(self) -> dict[str, int]:
        c = self.config
        return {
            "N": len(self.lengths),
            "B": self.batch_size,
            "T": max(self.lengths),
            "D": c.d_model,
            "L": c.n_layers,
        }

    def flops(self) -> float:
        return F.batches_forward_flops(self.config, self.padded_shapes())

    def tokens(self) -> int:
        return sum(self.lengths)  # real tokens only: padding is waste, not throughput

    def unsupported(self, subject: Subject) -> str | None:
        return _needs_models(subject)

    def sequences(self) -> list[np.ndarray]:
        rng = np.random.default_rng(self.seed + 1)
        return [_random_tokens(rng, self.config, (n,)) for n in self.lengths]

    def build(self, subject: Subject, dtype: str, reference: Reference) -> Case:
        params, model = _model(subject, self.config, self.seed, dtype)
        seqs = self.sequences()
        padded = [pad_batch([seqs[i] for i in b], self.config.pad_id) for b in self.batches()]
        native = [(subject.asarray(t), subject.asarray(m)) for t, m in padded]  # (B_b, T_b) each

        def run() -> list[object]:
            return [model.forward(tokens, valid=valid) for tokens, valid in native]

        fn = subject.calls(run, grad=False)

        def error() -> float:
            want = reference.decoder_logits(
                self.config, params, dtype, [t for t, _ in padded], [m for _, m in padded]
            )
            got = [subject.to_numpy(x) for x in fn()]
            return max(scaled_error(g, w) for g, w in zip(got, want, strict=True))

        waste = padding_waste(self.batches(), self.lengths)
        return Case(
            fn=fn,
            error=error,
            error_of="logits",
            bound=error_bound(dtype),
            extras={"padding_waste": waste},
        )


# --------------------------------------------------------------------------- training


@dataclass(frozen=True)
class TrainStep(DecoderForward):
    """One optimisation step of the decoder-only model on a ``(B, T)`` batch of random tokens:
    the decoder forward's sizes (and tokens/s), then the backward and the update.

    Loss, gradients, global-norm clipping and AdamW, through the training lab's
    trainer backend for the level (``lab.backend``): torch autograd at levels
    2-4, level 1's hand-written backward and numpy AdamW. The check compares
    the first step's gradients with float64 autograd (level 2) on the same
    parameters and batch.
    """

    @property
    def scenario(self) -> str:
        return "train step"

    def flops(self) -> float:
        # The backward costs about twice the forward (per weight matrix, one product
        # for its input's gradient and one for its own): the usual 3x-forward rule.
        return 3.0 * super().flops()

    def unsupported(self, subject: Subject) -> str | None:
        if not subject.models:
            return "attention only"
        return None if subject.has_grad else "no gradients at this level"

    def batch(self):
        from lab.data import Batch

        rng = np.random.default_rng(self.seed)
        seq = _random_tokens(rng, self.config, (self.B, self.T + 1))
        every = np.ones((self.B, self.T), dtype=bool)
        return Batch(inputs=seq[:, :-1], valid=every, targets=seq[:, 1:], scored=every)

    def build(self, subject: Subject, dtype: str, reference: Reference) -> Case:
        from lab.backend import OptimizerSettings, make_backend

        params = init_params(self.config, "decoder_only", self.seed)
        batch = self.batch()
        trainer = make_backend(
            subject.module,
            self.config,
            "decoder_only",
            params,
            OptimizerSettings(),
            device=subject.device,
            dtype=subject.native_dtype(dtype),
        )

        def step() -> float:
            loss = trainer.loss_and_grads(batch)
            trainer.step(1e-4)
            return loss

        def error() -> float:  # the first step, from the initial parameters
            trainer.loss_and_grads(batch)
            got = trainer.gradients()
            trainer.step(1e-4)
            want = reference.train_grads(self.config, params, batch)
            return max(scaled_error(got[name], want[name]) for name in want)

        return Case(fn=step, error=error, error_of="grads", bound=error_bound(dtype))
