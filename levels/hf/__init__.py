"""Hugging Face checkpoints in and out of the canonical parameters.

``load(path)`` reads a model directory as ``transformers`` writes it
(``config.json`` and ``model.safetensors``, or several shards listed in
``model.safetensors.index.json``) for ``model_type`` ``llama``, ``mistral``,
``qwen2``, ``gpt_neox`` or ``gemma3_text``, and returns a ``TransformerConfig`` with float64
canonical parameters that every level builds from. ``save(path, config,
params)`` writes the inverse, a directory that
``transformers.AutoModelForCausalLM.from_pretrained`` loads. Only ``safetensors``
(and numpy) is needed; ``transformers`` itself is never imported here.

Two layouts differ from the project's, and are converted:

* RoPE. The ladder rotates adjacent feature pairs ``(x[2i], x[2i+1])``;
  Hugging Face's ``rotate_half`` pairs feature ``i`` with feature ``i + Dh/2``,
  with the same frequency ``base^(-2i/Dh)``. Permuting the rows of the q and k
  projections (and of their biases) within each head, new row ``2i`` <- old
  row ``i`` and new row ``2i + 1`` <- old row ``i + Dh/2``, turns one rotation
  into the other; ``q . k`` is unchanged because both sides get the same
  permutation. Values are never permuted. ``save`` applies the inverse.
* GPT-NeoX fuses q, k and v into ``query_key_value`` with its rows grouped
  per head, ``(H, 3, Dh)``; the ladder's ``in_proj_weight`` is ``[q; k; v]``.

The rest is renaming (Llama's ``gate_proj``, ``up_proj``, ``down_proj`` are
``linear_gate``, ``linear1``, ``linear2``) and the options the families spell
differently: Llama's ``attention_bias`` covers q, k, v and the output
projection, its ``mlp_bias`` the three FFN linears (``bias``: RMSNorm has
none); Qwen2 has q, k, v biases only; Mistral's ``sliding_window`` and Qwen2's
``use_sliding_window`` are the ladder's ``window`` (a query sees its W most
recent keys, itself included, as in Hugging Face's masks). Embeddings are not
scaled (``scale_embeddings=False``). A key missing from ``config.json`` takes
the family's default in ``transformers`` (GPT-NeoX's ``use_parallel_residual``
is True and its ``rotary_pct`` 0.25 when absent, Mistral's ``sliding_window``
4096, Qwen2's ``num_key_value_heads`` 32).

Gemma 3 (``gemma3_text``, ``Gemma3ForCausalLM``) is the same layout with more
options: ``head_dim`` (heads wider than ``D / H``), ``q_norm`` and ``k_norm``
(QK-norm; their gains are permuted like the q and k rows they scale), a norm
after each sublayer (its ``post_attention_layernorm`` is the ladder's
``post_norm1``, ``pre_feedforward_layernorm`` its ``norm2``), GeGLU with the
tanh GELU, RMSNorm gains stored as offsets from 1 (``norm_weight_offset=1``),
embeddings scaled by ``sqrt(D)``, ``layer_types`` (every ``window_pattern``-th
layer global, the others local with ``sliding_window``) with the RoPE base of
each kind (``rope_parameters``, or ``rope_theta`` and ``rope_local_base_freq``),
and ``query_pre_attn_scalar`` (the scores' scale, ``1 / sqrt`` of it).

What the ladder does not compute is refused with a ``ValueError`` naming the
key and its value, never loaded as a different model: RoPE scaling of any type
but ``"default"`` (``rope_scaling`` / ``rope_parameters``), partial rotary,
GPT-NeoX's parallel residual, an activation other than SiLU (Llama family) or
exact GELU (GPT-NeoX), a ``head_dim`` other than ``hidden_size //
num_attention_heads``, a window on some layers only (Qwen2's
``max_window_layers`` / ``layer_types``), Gemma's logit soft-capping, its
bidirectional attention, or ``layer_types`` with no period, quantized weights,
any other ``model_type`` (Gemma 3's multimodal ``gemma3``, whose text model is
``gemma3_text``). Dropout rates are training settings and are not carried over
(the config's ``dropout`` is 0).

The package, by concern:

* ``families.py``: ``config.json`` <-> ``TransformerConfig``, family by family
  (``FAMILIES``, ``ARCHITECTURES``, each family's defaults; ``config_from_hf`` and
  its refusals; ``config_to_hf``, which picks the family that computes a config);
* ``layout.py``: the tensors under Hugging Face's names <-> the canonical
  parameters (the RoPE row permutations ``to_adjacent_pairs`` and
  ``to_rotate_half``, each family's tensor map, ``params_from_hf`` and
  ``params_to_hf``);
* ``checkpoint.py``: reading a model directory (``config.json`` and the
  safetensors shards): ``load_config``, ``load``;
* ``export.py``: writing one, ``save``;
* ``text.py``: its text, ``load_tokenizer`` and ``load_chat_template``.
"""

from __future__ import annotations

from .checkpoint import load, load_config
from .export import save
from .families import ARCHITECTURES, FAMILIES, config_from_hf, config_to_hf
from .layout import params_from_hf, to_adjacent_pairs, to_rotate_half
from .text import load_chat_template, load_tokenizer

__all__ = [
    "ARCHITECTURES",
    "FAMILIES",
    "config_from_hf",
    "config_to_hf",
    "load",
    "load_chat_template",
    "load_config",
    "load_tokenizer",
    "params_from_hf",
    "save",
    "to_adjacent_pairs",
    "to_rotate_half",
]
