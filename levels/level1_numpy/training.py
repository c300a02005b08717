"""Training at level 1: the loss, and models that return their gradients.

``loss_and_grads`` builds the model's own architecture once more with
``ops=`` a ``backward.Tape`` instead of plain numpy (the same classes of
``level0_loops`` over the same parameter arrays), so the forward that is
differentiated is the forward that ``model.forward`` computes. The loss is
the masked cross-entropy below; its gradient starts the tape's backward.
"""

from __future__ import annotations

import numpy as np

from ..common import public
from ..common.params import check_params, param_shapes
from ..level0_loops import models as level0_models
from . import convert
from .backward import Tape


def cross_entropy(
    logits: np.ndarray, targets: np.ndarray, scored: np.ndarray
) -> tuple[float, np.ndarray]:
    """Mean of ``-log softmax(logits)[target]`` over the ``scored`` positions, and its gradient.

    ``logits (B,T,V)``, ``targets (B,T)`` ints, ``scored (B,T)`` bool ->
    ``(loss, dloss/dlogits (B,T,V))``. With ``N`` scored positions and
    ``p = softmax(z)`` at one of them, ``d(-log p[y])/dz = p - onehot(y)``;
    the mean divides it by ``N``. Unscored positions (padding) get exactly 0.
    """
    if targets.shape != logits.shape[:-1] or scored.shape != logits.shape[:-1]:
        raise ValueError(
            f"targets {targets.shape} and scored {scored.shape} must be the logits' "
            f"(B, T) = {logits.shape[:-1]}"
        )
    if not scored.any():
        raise ValueError("the loss needs at least one scored target")
    z = logits[scored]  # (N, V)
    y = targets[scored]  # (N,)
    public.check_tokens(int(y.min()), int(y.max()), logits.shape[-1], what="target id")
    N = z.shape[0]
    # log-softmax with the row max subtracted: every exp argument is <= 0 and the
    # sum is >= 1, so neither overflow nor log(0) can occur.
    shifted = z - z.max(axis=-1, keepdims=True)  # (N, V)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))  # (N, V)
    rows = np.arange(N)
    loss = -log_p[rows, y].sum() / N
    d_z = np.exp(log_p)  # (N, V): p
    d_z[rows, y] -= 1.0  # p - onehot(y)
    d_logits = np.zeros_like(logits)  # (B,T,V)
    d_logits[scored] = d_z / N
    return float(loss), d_logits


def _check_scored_is_real(scored: np.ndarray, valid: np.ndarray) -> None:
    """A scored target must follow a real input: a padded position predicts nothing."""
    if scored.shape == valid.shape and (scored & ~valid).any():
        raise ValueError("scored marks a padded position; only real positions can be scored")


class Trainable:
    """Mixed into level 1's two models: owned parameters and a recorded forward.

    The model copies the caller's parameter dict once (in the model's dtype);
    every piece reads those arrays without copying them again
    (``convert.asarray``), so ``parameters()`` is the live state of the model:
    an optimiser updating its arrays in place changes the next forward.
    """

    kind: str
    architecture: type  # level 0's model class, built on the tape

    def __init__(self, config, params, *, device=None, dtype=None):
        check_params(params, param_shapes(config, self.kind))  # before copying: names the problems
        dtype = np.dtype(convert.DEFAULT_DTYPE if dtype is None else dtype)
        self._params = {name: np.array(value, dtype=dtype) for name, value in params.items()}
        super().__init__(config, self._params, device=device, dtype=dtype)

    def parameters(self) -> dict[str, np.ndarray]:
        """The arrays the model computes with, by canonical name; update them in place."""
        return self._params

    def _on_tape(self) -> tuple[Tape, object]:
        """A fresh tape, and this model's architecture computing on it over the same arrays."""
        if self.config.dropout > 0:
            raise ValueError(
                "level 1 does not implement dropout; train it with config.dropout == 0"
            )
        tape = Tape(self._params)
        return tape, self.architecture(self.config, self._params, ops=tape, dtype=self.dtype)

    def _scored(self, targets, scored):
        """``targets (B,T)`` as int64 and ``scored (B,T)`` (None: the real positions, once
        the model has checked ``valid``)."""
        targets = convert.asarray(targets)
        if scored is None:
            return targets, None
        scored = convert.asarray(scored)
        public.check_valid_shape(
            scored.shape, targets.shape, scored.dtype == np.bool_, what="scored"
        )
        return targets, scored


class DecoderOnlyTraining(Trainable):
    kind = "decoder_only"
    architecture = level0_models.DecoderOnlyTransformer

    def loss_and_grads(
        self, inputs, targets, *, valid=None, scored=None
    ) -> tuple[float, dict[str, np.ndarray]]:
        """Masked next-token cross-entropy and its gradient for every parameter.

        ``inputs (B,T)`` and ``targets (B,T)`` token ids; ``valid (B,T)`` as in
        ``forward`` (default: every token is real); ``scored (B,T)``: the
        targets that count (default: those of the real positions). The loss is the
        mean over scored targets. Returns ``(loss, {name: gradient})`` with
        exactly the keys of ``parameters()``.
        """
        targets, scored = self._scored(targets, scored)
        tape, model = self._on_tape()
        logits, valid = model.logits(inputs, valid=valid)  # (B,T,V), padded rows not zeroed
        valid = np.asarray(valid, dtype=bool)  # (B,T), as the public layer checked it
        scored = valid if scored is None else scored
        _check_scored_is_real(scored, valid)
        loss, d_logits = cross_entropy(logits, targets, scored)
        return loss, tape.backward(logits, d_logits)


class Seq2SeqTraining(Trainable):
    kind = "seq2seq"
    architecture = level0_models.Seq2SeqTransformer

    def loss_and_grads(
        self, src, tgt_in, tgt_out, *, src_valid=None, tgt_valid=None, scored=None
    ) -> tuple[float, dict[str, np.ndarray]]:
        """Teacher-forced cross-entropy of ``tgt_out (B,T)`` and every parameter's gradient.

        ``src (B,S)``, ``tgt_in (B,T)``; valid masks default to all real as in
        ``forward``; ``scored (B,T)`` defaults to the real target positions.
        Returns ``(loss, {name: gradient})`` with the keys of ``parameters()``.
        """
        targets, scored = self._scored(tgt_out, scored)
        tape, model = self._on_tape()
        logits, valid = model.logits(src, tgt_in, src_valid=src_valid, tgt_valid=tgt_valid)
        valid = np.asarray(valid, dtype=bool)  # (B,T), as the public layer checked it
        scored = valid if scored is None else scored
        _check_scored_is_real(scored, valid)  # logits (B,T,V), padded rows not zeroed
        loss, d_logits = cross_entropy(logits, targets, scored)
        return loss, tape.backward(logits, d_logits)
