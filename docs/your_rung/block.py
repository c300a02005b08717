"""Stage 5: the attention layer and the pre-norm block (docs/your_rung.md, stage 5)."""

from levels.level1_numpy import models as level1

from . import ops


class MultiHeadAttention(level1.MultiHeadAttention):
    """Self-attention: ``x (B,T,D)`` -> ``(B,T,D)``."""

    ops = ops

    def __call__(self, x, positions=None, mask=None, cache=None, index=0):
        B, T, _ = x.shape

        def heads(w, b, n):  # (B,T,D) -> (B,n,T,Dh): head h owns features h Dh .. (h+1) Dh - 1
            h = x @ w.T if b is None else x @ w.T + b  # (B,T,n Dh)
            return h.reshape(B, T, n, -1).transpose(0, 2, 1, 3)

        q = heads(self.w_q, self.b_q, self.n_heads)  # (B,H,T,Dh)
        k = heads(self.w_k, self.b_k, self.n_kv_heads)  # (B,Hkv,T,Dh)
        v = heads(self.w_v, self.b_v, self.n_kv_heads)  # (B,Hkv,T,Dh)
        if self.rope_base is not None and positions is not None:
            q = self.ops.rope(q, positions, self.rope_base)
            k = self.ops.rope(k, positions, self.rope_base)
        if cache is not None:
            k, v = cache.update(index, k, v)  # (B,Hkv,S,Dh): every key the cache holds
        o = self.ops.attend(q, k, v, mask=mask, scale=self.scale)  # (B,H,T,Dh)
        o = o.transpose(0, 2, 1, 3).reshape(B, T, -1)  # (B,T,H Dh)
        return o @ self.w_o.T if self.b_o is None else o @ self.w_o.T + self.b_o  # (B,T,D)


class EncoderLayer(level1.EncoderLayer):
    """The pre-norm block: ``x (B,T,D)`` -> ``(B,T,D)``."""

    ops = ops
    Attention = MultiHeadAttention

    def __call__(self, x, positions=None, mask=None, cache=None, index=0):
        x = x + self.self_attn(self.norm1(x), positions, mask, cache, index)  # (B,T,D)
        return x + self.ff(self.norm2(x))  # (B,T,D)
