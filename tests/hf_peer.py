"""transformers as a float64 peer: the two steps it computes in float32 even in a float64
model, patched to float64, so a float64 level differs from it by rounding order only.

transformers computes RoPE's inverse frequencies and angles in float32
(``LlamaRotaryEmbedding.forward``: ``position_ids.float() * inv_freq.float()``,
then cos/sin cast to the model's dtype) and, in the Llama and Gemma families,
RMSNorm (``LlamaRMSNorm.forward``: ``hidden_states.to(torch.float32)``;
``Gemma3RMSNorm.forward``: ``self._norm(x.float()) * (1.0 + self.weight.float())``).
``make_exact`` replaces both forwards on a loaded model's modules with float64
ones; the weights and every other step are transformers' own.
"""

from __future__ import annotations

from functools import partial

import torch


def _rms_norm_float64(module, x):
    """transformers' RMSNorm without its cast to float32."""
    return module.weight * (
        x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + module.variance_epsilon)
    )


def _gemma_rms_norm_float64(module, x):
    """Gemma 3's RMSNorm in the model's dtype: ``x / rms(x) * (1 + weight)``."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + module.eps) * (1.0 + module.weight)


def _rope_float64(module, x, position_ids, layer_type=None):
    """transformers' default RoPE tables (rotate_half layout) with float64 angles; Gemma 3's
    take a ``layer_type``, each type with its own base."""
    if layer_type is None:
        inv_freq, rope = module.inv_freq, module.config.rope_parameters
    else:
        inv_freq = getattr(module, f"{layer_type}_inv_freq")
        rope = module.config.rope_parameters[layer_type]
    dim = 2 * inv_freq.numel()
    inv_freq = rope["rope_theta"] ** (
        -torch.arange(0, dim, 2, dtype=torch.float64) / dim
    )  # (Dh/2,)
    freqs = position_ids[..., None].double() * inv_freq  # (B,T,Dh/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (B,T,Dh)
    return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def make_exact(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with its RMSNorms and rotary tables computed in its own dtype (float64)."""
    for module in model.modules():
        kind = type(module).__name__
        if kind == "Gemma3RMSNorm":
            module.forward = partial(_gemma_rms_norm_float64, module)
        elif kind.endswith("RMSNorm"):
            module.forward = partial(_rms_norm_float64, module)
        elif kind.endswith("RotaryEmbedding"):
            module.forward = partial(_rope_float64, module)
    return model
