"""Trainer backends: how the training loop gets a loss, gradients and an update from a level.

The loop in ``lab.train`` never touches a framework directly; it asks a
:class:`TrainerBackend` for four things:

* ``loss_and_grads(batch)``: the masked cross-entropy of a batch, leaving the
  gradients of every parameter inside the backend;
* ``step(lr)``: clip the gradients to a global norm and apply one AdamW update;
* ``logits(batch)`` and ``model`` (the level's own model, for ``generate``):
  inference for the metrics and the preflight;
* ``state()`` / ``load_state(state)``: parameters and optimiser moments keyed by
  the *canonical* parameter names, so a checkpoint written at one level can be
  resumed at another.

Levels 2-4 are ``torch.nn.Module``s, so one backend, :class:`TorchAutogradBackend`,
serves all three: autograd computes the gradients. A level without autograd
(level 1, numpy) plugs in by implementing the same abstract class with its own
hand-written backward and optimiser; ``make_backend`` is the one place that
chooses.

The update is AdamW (Loshchilov & Hutter): ``torch.optim.AdamW`` for the torch
levels, and for level 1 the course's own hand-written one, ``levels.level1_numpy.optim.AdamW``,
whose docstring derives it and which computes what torch's does, step for step.
Decay is applied to weight matrices only (``ndim >= 2``): shrinking biases and
LayerNorm gains towards zero has no regularising purpose. Embeddings are
matrices and are decayed, as in nanoGPT.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import torch

from levels.common.config import TransformerConfig
from levels.common.params import param_shapes

from .data import Batch
from .loss import masked_cross_entropy


@dataclass(frozen=True)
class OptimizerSettings:
    """AdamW and clipping. ``lr`` here is the peak; the loop's schedule scales it per step."""

    betas: tuple[float, float] = (0.9, 0.98)  # b2 < 0.999 adapts faster on short runs
    eps: float = 1e-8  # torch's default
    weight_decay: float = 0.01
    clip_norm: float = 1.0  # global L2 norm of all gradients together


class TrainerBackend(ABC):
    """What the training loop, the metrics and the preflight need from a level."""

    level: ModuleType
    config: TransformerConfig
    kind: str  # "seq2seq" or "decoder_only"
    model: Any  # the level's model object (forward / generate)

    # -- arrays -------------------------------------------------------------
    def to_native(self, array: np.ndarray) -> Any:
        """numpy -> the level's array type."""
        return self.level.asarray(array)

    def to_numpy(self, x: Any) -> np.ndarray:
        return np.asarray(self.level.to_numpy(x))

    def seed(self, seed: int) -> None:
        """Seed whatever randomness training uses (dropout); nothing by default."""
        return None

    # -- inference ----------------------------------------------------------
    @contextlib.contextmanager
    def inference(self) -> Iterator[None]:
        """A context for evaluation (no gradient tape, no dropout)."""
        yield

    def forward(self, batch: Batch, model: Any = None) -> Any:
        """Teacher-forced logits ``(B, T, V)`` in the level's array type, from ``model``
        (default: the level's model; the data-parallel wrapper when training on several ranks)."""
        model = self.model if model is None else model
        inputs, valid = self.to_native(batch.inputs), self.to_native(batch.valid)
        if self.kind == "seq2seq":
            return model(
                self.to_native(batch.src),
                inputs,
                src_valid=self.to_native(batch.src_valid),
                tgt_valid=valid,
            )
        return model(inputs, valid=valid)

    def logits(self, batch: Batch) -> np.ndarray:
        """Teacher-forced logits ``(B, T, V)`` as numpy (call inside ``inference()``)."""
        return self.to_numpy(self.forward(batch))

    @abstractmethod
    def loss(self, batch: Batch) -> float:
        """Masked cross-entropy of ``batch`` in inference mode (no dropout, no gradients)."""

    # -- training -----------------------------------------------------------
    @abstractmethod
    def loss_and_grads(self, batch: Batch) -> float:
        """Masked cross-entropy of ``batch``; fresh gradients are kept for ``step``."""

    @abstractmethod
    def gradients(self) -> dict[str, np.ndarray]:
        """The gradients left by the last ``loss_and_grads``, by canonical name."""

    @abstractmethod
    def step(self, lr: float) -> float:
        """Clip and apply one AdamW update at learning rate ``lr``; return the
        global gradient norm measured *before* clipping."""

    @abstractmethod
    def state(self) -> dict[str, Any]:
        """``{"params": {name: array}, "optimizer": {"step": int, "exp_avg": {name: array},
        "exp_avg_sq": {name: array}}, "rng": uint8 array or None}``, arrays as numpy."""

    @abstractmethod
    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore what ``state()`` returned (possibly from another backend or level)."""


def _model_class(level: ModuleType, kind: str) -> type:
    if kind == "seq2seq":
        return level.Seq2SeqTransformer
    if kind == "decoder_only":
        return level.DecoderOnlyTransformer
    raise ValueError(f"kind must be 'seq2seq' or 'decoder_only', got {kind!r}")


class TorchAutogradBackend(TrainerBackend):
    """Levels whose models are ``torch.nn.Module``s (2, 3, 4): autograd does the backward."""

    def __init__(
        self,
        level: ModuleType,
        config: TransformerConfig,
        kind: str,
        params: Mapping[str, np.ndarray],
        settings: OptimizerSettings,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        world=None,
        fsdp: bool = False,
    ):
        if fsdp and world is None:
            raise ValueError("fsdp shards the model across processes: it needs a world")
        self.level, self.config, self.kind, self.settings = level, config, kind, settings
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.model = _model_class(level, kind)(
            config, dict(params), device=self.device, dtype=dtype
        )
        # Data parallel (lab/distributed.py): training goes through the wrapper, which
        # averages the gradients over the ranks; FSDP2 shards the parameters themselves,
        # so it must come before the optimiser sees them.
        self.world, self.fsdp = world, fsdp
        self.trained = self.model
        if world is not None and fsdp:
            from torch.distributed.fsdp import fully_shard

            # FSDP2 shards a parameter along its first axis and takes only contiguous ones;
            # level 2 lays its matrices out for one-row decoding (arrays.matvec_layout),
            # which training, a product of whole batches, does not need.
            for param in self.model.parameters():
                param.data = param.data.contiguous()
            for module in self.model.modules():
                if isinstance(module, (level.EncoderLayer, getattr(level, "DecoderLayer", ()))):
                    fully_shard(module)
            fully_shard(self.model)
        elif world is not None:
            from torch.nn.parallel import DistributedDataParallel

            self.trained = DistributedDataParallel(self.model)
        self.named = dict(self.model.named_parameters())
        expected = param_shapes(config, kind)
        if set(self.named) != set(expected):
            raise ValueError(
                f"{level.__name__} parameters do not carry the canonical names: "
                f"missing {sorted(set(expected) - set(self.named))}, "
                f"extra {sorted(set(self.named) - set(expected))}"
            )
        decay = [p for p in self.named.values() if p.ndim >= 2]
        no_decay = [p for p in self.named.values() if p.ndim < 2]
        self.optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": settings.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=0.0,  # set by the schedule at every step
            betas=settings.betas,
            eps=settings.eps,
            # One fused loop over all tensors instead of a Python loop per tensor
            # (torch picks it only on GPUs by default); the same arithmetic.
            foreach=True,
        )
        # The optimiser numbers parameters in group order; this maps those numbers to names.
        name_of = {id(p): name for name, p in self.named.items()}
        self.order = [name_of[id(p)] for g in self.optimizer.param_groups for p in g["params"]]

    def to_native(self, array: np.ndarray) -> Any:
        return self.level.asarray(array, device=self.device)

    def seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    @contextlib.contextmanager
    def inference(self) -> Iterator[None]:
        was_training = self.model.training
        self.model.eval()
        if self.fsdp:  # prefill / decode_step are not forward: gather the root's parameters
            self.model.unshard()
        try:
            with torch.no_grad():
                yield
        finally:
            if self.fsdp:
                self.model.reshard()
            self.model.train(was_training)

    def _loss(self, batch: Batch, model=None) -> torch.Tensor:
        logits = self.forward(batch, model)  # (B, T, V)
        return masked_cross_entropy(
            logits, self.to_native(batch.targets), self.to_native(batch.scored)
        )

    def loss(self, batch: Batch) -> float:
        with self.inference():
            return float(self._loss(batch))

    def loss_and_grads(self, batch: Batch) -> float:
        if not self.model.training:
            self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        if self.world is None:
            loss = self._loss(batch)
            loss.backward()
            return float(loss.detach())
        # This rank's rows of the global batch, weighted so that the gradient average
        # over ranks is the gradient of the global mean (lab/distributed.py).
        from . import distributed

        local = distributed.shard(batch, self.world)
        loss = self._loss(local, self.trained)
        (loss * distributed.loss_scale(local, batch, self.world)).backward()
        share = float(loss.detach()) * local.n_scored / batch.n_scored
        return distributed.all_sum(share)  # the global batch's mean loss, on every rank

    def gradients(self) -> dict[str, np.ndarray]:
        missing = [name for name, p in self.named.items() if p.grad is None]
        if missing:
            raise ValueError(f"no gradient reached: {', '.join(missing)}")
        return {name: _whole(p.grad) for name, p in self.named.items()}

    def step(self, lr: float) -> float:
        params = list(self.named.values())
        norm = torch.nn.utils.clip_grad_norm_(params, self.settings.clip_norm)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        return float(norm)

    def state(self) -> dict[str, Any]:
        params = {n: _whole(p) for n, p in self.named.items()}
        moments: dict[str, dict[str, np.ndarray]] = {"exp_avg": {}, "exp_avg_sq": {}}
        step = 0
        for name, p in self.named.items():
            st = self.optimizer.state.get(p)
            if st:
                step = int(st["step"])
                for key in moments:
                    moments[key][name] = _whole(st[key])
        return {
            "params": params,
            "optimizer": {"step": step, **moments},
            "rng": torch.get_rng_state().numpy().copy(),
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        params = state["params"]
        if set(params) != set(self.named):
            raise ValueError(
                f"checkpoint parameters differ: missing {sorted(set(self.named) - set(params))}, "
                f"extra {sorted(set(params) - set(self.named))}"
            )
        with torch.no_grad():
            for name, p in self.named.items():
                p.copy_(_like(p, params[name]))
        opt = state["optimizer"]
        torch_state = {}
        if opt["step"] > 0:
            for index, name in enumerate(self.order):
                torch_state[index] = {
                    # torch keeps the step as a float32 scalar tensor; only its value matters.
                    "step": torch.tensor(float(opt["step"]), dtype=torch.float32),
                    "exp_avg": _like(self.named[name], opt["exp_avg"][name]),
                    "exp_avg_sq": _like(self.named[name], opt["exp_avg_sq"][name]),
                }
        groups = self.optimizer.state_dict()["param_groups"]
        self.optimizer.load_state_dict({"state": torch_state, "param_groups": groups})
        if state.get("rng") is not None:
            torch.set_rng_state(torch.as_tensor(np.asarray(state["rng"]), dtype=torch.uint8))


def _whole(t: torch.Tensor) -> np.ndarray:
    """A parameter or moment as one numpy array (an FSDP shard gathered from every rank)."""
    t = t.detach()
    if hasattr(t, "full_tensor"):  # a DTensor: this rank holds a shard
        t = t.full_tensor()
    return t.cpu().numpy().copy()


def _like(p: torch.Tensor, array) -> torch.Tensor:
    """``array`` as a tensor laid out as ``p``: sharded like it when ``p`` is a DTensor."""
    t = torch.as_tensor(np.asarray(array))
    if hasattr(p, "device_mesh"):
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(t.to(p.device, p.dtype), p.device_mesh, p.placements)
    return t


class NumpyBackend(TrainerBackend):
    """A level without autograd (level 1): the model's own ``loss_and_grads`` and the
    level's numpy ``AdamW`` and ``clip_grad_norm`` (``level.optim``), which compute
    what torch's do, so a level-1 run follows a level-2 run's loss curve."""

    def __init__(
        self,
        level: ModuleType,
        config: TransformerConfig,
        kind: str,
        params: Mapping[str, np.ndarray],
        settings: OptimizerSettings,
        *,
        dtype: np.dtype | None = None,
    ):
        self.level, self.config, self.kind, self.settings = level, config, kind, settings
        self.model = _model_class(level, kind)(config, dict(params), dtype=dtype)
        self.optim = level.optim  # AdamW and clip_grad_norm in numpy
        live = self.model.parameters()  # the arrays the model computes with
        self.optimizer = self.optim.AdamW(
            live,
            lr=0.0,
            betas=settings.betas,
            eps=settings.eps,
            weight_decay={
                n: settings.weight_decay if w.ndim >= 2 else 0.0 for n, w in live.items()
            },
        )
        self._grads: dict[str, np.ndarray] | None = None

    def _arguments(self, batch: Batch) -> tuple[tuple, dict]:
        if self.kind == "seq2seq":
            args = (batch.src, batch.inputs, batch.targets)
            return args, {
                "src_valid": batch.src_valid,
                "tgt_valid": batch.valid,
                "scored": batch.scored,
            }
        return (batch.inputs, batch.targets), {"valid": batch.valid, "scored": batch.scored}

    def loss(self, batch: Batch) -> float:
        # No separate forward-only loss here: the recorded forward is the same
        # arithmetic, and its gradients are simply dropped.
        args, kwargs = self._arguments(batch)
        return float(self.model.loss_and_grads(*args, **kwargs)[0])

    def loss_and_grads(self, batch: Batch) -> float:
        args, kwargs = self._arguments(batch)
        loss, self._grads = self.model.loss_and_grads(*args, **kwargs)
        return float(loss)

    def gradients(self) -> dict[str, np.ndarray]:
        if self._grads is None:
            raise ValueError("no gradients yet: call loss_and_grads first")
        return {name: g.copy() for name, g in self._grads.items()}

    def step(self, lr: float) -> float:
        if self._grads is None:
            raise ValueError("no gradients yet: call loss_and_grads first")
        norm = self.optim.clip_grad_norm(self._grads, self.settings.clip_norm)
        self.optimizer.step(self._grads, lr=lr)
        self._grads = None
        return float(norm)

    def state(self) -> dict[str, Any]:
        return {
            "params": {n: np.array(w) for n, w in self.model.parameters().items()},
            "optimizer": self.optimizer.state(),
            "rng": None,  # nothing random: level 1 has no dropout
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        live = self.model.parameters()
        params = state["params"]
        if set(params) != set(live):
            raise ValueError(
                f"checkpoint parameters differ: missing {sorted(set(live) - set(params))}, "
                f"extra {sorted(set(params) - set(live))}"
            )
        for name, w in live.items():
            w[...] = params[name]  # in place: the model reads these very arrays
        self.optimizer.load_state(state["optimizer"])


def is_torch_level(level: ModuleType) -> bool:
    """Whether the level's arrays are torch tensors (and so autograd can train it)."""
    return level.FACTS.array == "torch"


def check_trainable(level: ModuleType, kind: str, *, parallel: bool = False) -> None:
    """Raise ``ValueError`` if ``level`` has no way to compute gradients (its ``GRADIENTS``),
    or, with ``parallel``, none that data-parallel training can use (autograd's)."""
    _model_class(level, kind)  # an unknown kind is refused first
    name = level.__name__.rsplit(".", 1)[-1]
    if level.FACTS.gradients is None:
        raise ValueError(
            f"{name} computes no gradients (inference only); train at level 1 or above"
        )
    if parallel and level.FACTS.gradients != "autograd":
        raise ValueError(
            f"{name} trains with its own numpy backward; "
            "data-parallel training needs a torch level (2, 3 or 4)"
        )


def make_backend(
    level: ModuleType,
    config: TransformerConfig,
    kind: str,
    params: Mapping[str, np.ndarray],
    settings: OptimizerSettings,
    *,
    device: str | None = None,
    dtype=None,
    world=None,
    fsdp: bool = False,
) -> TrainerBackend:
    """The backend that trains ``level``: autograd for torch levels (``GRADIENTS ==
    "autograd"``); the level's own ``loss_and_grads`` and numpy optimiser for a level
    with a hand-written backward. ``dtype`` is the level's native float dtype (default:
    the level's default)."""
    check_trainable(level, kind, parallel=world is not None)
    if level.FACTS.gradients == "autograd":
        return TorchAutogradBackend(
            level,
            config,
            kind,
            params,
            settings,
            device=device,
            dtype=dtype,
            world=world,
            fsdp=fsdp,
        )
    if device not in (None, "cpu"):
        raise ValueError(f"{level.__name__} runs on the CPU only, not {device!r}")
    return NumpyBackend(level, config, kind, params, settings, dtype=dtype)
