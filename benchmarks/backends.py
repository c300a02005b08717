"""A level, or one of PyTorch's SDPA backends, seen through one small adapter.

The harness never asks which level it is running. It asks a ``Backend`` for
the few things that differ: how to turn numpy inputs into the native array
type and back, how to wait for the device, which dtypes make sense, whether
gradients exist, and how to measure memory. Everything else (warm-up, timing,
statistics, FLOPs) is the same code for every level.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

import levels

NUMPY_DTYPES = ("float64", "float32", "float16")  # numpy has no bfloat16
TORCH_DTYPES = ("float64", "float32", "float16", "bfloat16")
SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")


@dataclass
class Backend:
    """One column of the ladder: the callables and facts the harness needs.

    ``kind`` is the native array type: ``"python"`` (nested lists),
    ``"numpy"`` or ``"torch"``. ``interpreted`` marks the Triton interpreter,
    whose timings are an emulation on the CPU, never a GPU figure.
    """

    name: str
    description: str
    kind: str
    device: str
    module: ModuleType | None = None  # the level module (None for an SDPA peer)
    interpreted: bool = False
    attention: Callable[..., Any] | None = None  # (q, k, v, *, causal) -> out
    context: Callable[[], contextlib.AbstractContextManager] = field(
        default=contextlib.nullcontext
    )  # entered around every call (an SDPA backend choice)

    @property
    def has_models(self) -> bool:
        return self.module is not None

    @property
    def has_grad(self) -> bool:
        """Torch levels are differentiable by autograd (level 4 through its own backward
        kernel); level 1 has a hand-written attention backward, ``attention_grads``."""
        return self.kind == "torch" or callable(getattr(self.module, "attention_grads", None))

    @property
    def memory_method(self) -> str:
        if self.interpreted:
            return "n/a"
        if self.kind in ("python", "numpy"):
            return "tracemalloc"
        return "cuda" if self.device.startswith("cuda") else "torch.profiler"

    def unsupported(self, dtype: str) -> str | None:
        """Why this backend cannot run ``dtype``, or None if it can."""
        if self.kind == "python":
            return None  # level 0 always computes in float64; the record says so
        if self.kind == "numpy" and dtype not in NUMPY_DTYPES:
            return f"numpy has no {dtype}"
        if self.kind == "torch" and dtype not in TORCH_DTYPES:
            return f"unknown dtype {dtype}"
        if self.interpreted and dtype == "bfloat16":
            return "bfloat16 is not emulated correctly by the Triton interpreter"
        return None

    def effective_dtype(self, dtype: str) -> str:
        """The dtype the backend really computes in (level 0: always float64)."""
        return "float64" if self.kind == "python" else dtype

    def native_dtype(self, dtype: str) -> Any:
        """``dtype`` as the level's ``asarray`` / constructors expect it."""
        if self.kind == "python":
            return None  # level 0 accepts only dtype=None
        if self.kind == "numpy":
            return np.dtype(dtype)
        import torch

        return getattr(torch, dtype)

    def asarray(self, a: np.ndarray, dtype: str | None = None) -> Any:
        """numpy -> native. Floating arrays take ``dtype``; ints and bools keep their kind."""
        native = self.native_dtype(dtype) if dtype and a.dtype.kind == "f" else None
        if self.module is not None:
            return self.module.asarray(a, device=self.device, dtype=native)
        import torch

        return torch.as_tensor(a, device=self.device, dtype=native)

    def to_numpy(self, x: Any) -> np.ndarray:
        if self.module is not None:
            return np.asarray(self.module.to_numpy(x))
        return x.detach().to("cpu", dtype=_float64_of(x)).numpy()

    def sync(self) -> None:
        """Wait for queued device work (CUDA launches are asynchronous)."""
        if self.kind == "torch" and self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize(self.device)


def _float64_of(x: Any) -> Any:
    import torch

    return torch.float64 if x.is_floating_point() else x.dtype


def _kind_of(module: ModuleType) -> str:
    """Classify a level by the array type its ``asarray`` returns."""
    probe = module.asarray(np.zeros((1,), dtype=np.float64))
    if isinstance(probe, list):
        return "python"
    if isinstance(probe, np.ndarray):
        return "numpy"
    if type(probe).__module__.startswith("torch"):
        return "torch"
    raise TypeError(f"{module.__name__}.asarray returned an unknown array type {type(probe)}")


def _describe(module: ModuleType, device: str, native_dtype: Any) -> str:
    """``module.describe()``, told the device and dtype when it takes them (level 3 does:
    which SDPA backend runs depends on both)."""
    describe = getattr(module, "describe", None)
    if describe is None:
        return module.__name__
    accepts = inspect.signature(describe).parameters
    kwargs = {"device": device, "dtype": native_dtype}
    return describe(**{k: v for k, v in kwargs.items() if k in accepts and v is not None})


def level_backend(name: str, module: ModuleType, device: str, dtype: str = "float32") -> Backend:
    """Wrap a loaded level module. Python and numpy levels always run on the CPU."""
    kind = _kind_of(module)
    device = device if kind == "torch" else "cpu"
    native = None
    if kind == "torch":
        import torch

        native = getattr(torch, dtype, None)
    description = _describe(module, device, native)
    return Backend(
        name=name,
        description=description,
        kind=kind,
        device=device,
        module=module,
        # describe() is the level's own word for what computes (docs/conventions.md).
        interpreted="interpret" in description.lower(),
        attention=module.attention,
    )


def load_backends(
    names: list[str] | None, device: str, dtype: str = "float32"
) -> tuple[list[Backend], dict[str, str]]:
    """Load the requested levels (default: all); returns (backends, {name: why unavailable})."""
    wanted = list(levels.LEVELS) if names is None else names
    backends: list[Backend] = []
    unavailable: dict[str, str] = {}
    for name in wanted:
        try:
            module = levels.load(name)
            backends.append(level_backend(name, module, device, dtype))
        except (ImportError, AttributeError, TypeError) as exc:
            unavailable[name] = str(exc)
    return backends, unavailable


def sdpa_backend(which: str, device: str) -> Backend:
    """PyTorch's ``scaled_dot_product_attention`` pinned to one backend, as a peer of level 4.

    Attention only (no models). The benchmark's attention is self-attention
    with ``T == S``, where SDPA's top-left causal alignment equals the
    ladder's bottom-right one; ``T != S`` with causal is refused.
    """
    if which not in SDPA_BACKENDS:
        raise ValueError(f"unknown SDPA backend {which!r}; choose one of {SDPA_BACKENDS}")
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    choice = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "math": SDPBackend.MATH,
    }[which]

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False):
        if causal and q.shape[-2] != k.shape[-2]:
            raise ValueError("the SDPA peer is causal only for T == S (top-left = bottom-right)")
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # (B,H,T,Dh)

    @contextlib.contextmanager
    def pinned() -> Iterator[None]:
        with sdpa_kernel([choice]):
            yield

    return Backend(
        name=f"sdpa:{which}",
        description=f"torch SDPA, {which} backend only",
        kind="torch",
        device=device,
        attention=attention,
        context=pinned,
    )
