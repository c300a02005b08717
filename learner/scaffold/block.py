"""Stage 5: the attention layer and the pre-norm block (docs/prelude.md, "Queries, keys and
values" to "The block: a residual stream, normalised on the way in"; docs/your_rung.md,
stage 5).

Both classes are level 1's with the call written by you: level 1 reads the parameters
from the canonical dict (``__init__``), you write what the layer computes with them.
"""

import numpy as np  # noqa: F401  (what you will write it with)

from learner.stages import stage
from levels.level1_numpy import models as level1

from . import ops


class MultiHeadAttention(level1.MultiHeadAttention):
    """Self-attention: ``x (B,T,D)`` -> ``(B,T,D)``.

    What level 1's ``__init__`` leaves you: ``self.w_q (H Dh, D)``, ``self.w_k`` and
    ``self.w_v (Hkv Dh, D)``, ``self.w_o (D, H Dh)``, and their biases ``self.b_q``,
    ``self.b_k``, ``self.b_v``, ``self.b_o`` (each None without one); ``self.n_heads``
    (``H``), ``self.n_kv_heads`` (``Hkv``); ``self.rope_base`` (None: no RoPE);
    ``self.scale`` (None: ``1 / sqrt(Dh)``). ``self.ops`` is this rung's arithmetic:
    your ``rope`` and your attention (``self.ops.attend``).
    """

    ops = ops

    def __call__(self, x, positions=None, mask=None, cache=None, index=0):
        """``x (B,T,D)``, ``positions (B,T)`` (what RoPE turns by; None: no rotation), ``mask``
        broadcastable to ``(B,H,T,S)`` (True = may attend) -> ``(B,T,D)``.

        1. ``q = x @ w_q^T + b_q``, split into ``H`` heads of ``Dh`` features: ``(B,H,T,Dh)``
           (head ``h`` owns features ``h Dh`` to ``(h + 1) Dh - 1``); ``k`` and ``v`` the
           same with ``Hkv`` heads: ``(B,Hkv,T,Dh)``.
        2. With ``self.rope_base`` set and ``positions`` given, rotate ``q`` and ``k`` (not
           ``v``) with ``rope(., positions, self.rope_base)``.
        3. With a ``cache``: ``k, v = cache.update(index, k, v)``, every key and value the
           cache holds for this layer (stage 6), ``(B,Hkv,S,Dh)``.
        4. Attend (``self.ops.attend(q, k, v, mask=mask, scale=self.scale)``,
           ``(B,H,T,Dh)``), merge the heads back into ``(B,T,H Dh)`` and project:
           ``@ w_o^T + b_o``.
        """
        raise NotImplementedError(stage("block").not_written())


class EncoderLayer(level1.EncoderLayer):
    """The pre-norm block: ``x (B,T,D)`` -> ``(B,T,D)``.

    Level 1's ``__init__`` builds ``self.norm1``, ``self.self_attn`` (your
    ``MultiHeadAttention`` above), ``self.norm2`` and ``self.ff`` (the feed-forward), each
    a callable: ``self.norm1(x)``.
    """

    ops = ops
    Attention = MultiHeadAttention

    def __call__(self, x, positions=None, mask=None, cache=None, index=0):
        """``x (B,T,D)``; ``positions``, ``mask``, ``cache`` and ``index`` for the attention.

        ``x + attention(norm1(x))``, then ``+ ff(norm2(x))`` of that: each sublayer reads a
        normalised copy of the stream and adds what it computes to it.
        """
        raise NotImplementedError(stage("block").not_written())


# To take level 1's block instead of writing your own, delete the two methods named
# __call__ above: the classes then run level 1's, with your attention, RoPE and norms.
