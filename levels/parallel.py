"""Attention over a sequence sharded across processes: ring attention and its all-gather baseline.

Where this sits on the ladder
-----------------------------
Every rung so far computes attention on one device. Past one device the
sequence itself is split: with ``W`` processes each holds a shard of ``T / W``
positions of ``q``, ``k`` and ``v`` and must produce the output of its own
queries against *all* the keys. Nothing new is needed to compute a block:
any torch level's ``attention(..., return_lse=True)`` does it. What is new is
where the keys are, and the one piece of algebra that makes the answer exact,
the log-sum-exp merge that level 4's online softmax uses for tiles and
flash-decoding uses for slices of the cache (docs/level4_triton_kernel.md,
"Splits, tiles and devices: one merge"): attention over disjoint key blocks,
each with its log-sum-exp, merges into attention over their union.

* ``allgather_attention``: every rank gathers all the keys and values, then
  attends locally. Simple; each rank holds the whole ``(T, Dh)`` K and V.
* ``ring_attention`` (Liu, Zaharia and Abbeel 2023): the ranks form a ring.
  At each of ``W`` hops a rank attends its queries to the block of keys it
  holds, merges that partial result into its running one by log-sum-exp, and
  passes the block to the next rank while it computes
  (``batch_isend_irecv``, posted before the block's attention). Each rank
  holds two key blocks at a time, never the whole sequence. The backward pass
  sends the blocks around again, with the gradients of each block's keys and
  values travelling beside it, back to the rank that owns it.

Layouts
-------
``"contiguous"``: rank ``r`` holds positions ``[r T/W, (r+1) T/W)``. With
causal attention the last rank sees every key and the first only its own:
the work is unbalanced. ``"zigzag"``: the sequence is cut into ``2W`` chunks
and rank ``r`` holds chunks ``r`` and ``2W - 1 - r``, one early and one late,
so every rank does the same work. ``shard`` and ``unshard`` convert a full
tensor to a rank's shard and back.

Masks are key padding masks, True = a real key: this rank's shard of the global
key validity, as ``(B, T/W)`` or in ``attention()``'s own form ``(B, 1, 1, T/W)``
(what a model's attention layer passes). Causal attention is over global positions
(``T = S``, so bottom-right and top-left coincide). A query with no key at
all anywhere is the usual ``ValueError``, raised on every rank alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import replace

import torch
import torch.distributed as dist

from .common.checks import EMPTY_ROW_MESSAGE

LAYOUTS = ("contiguous", "zigzag")
Attention = Callable[..., tuple[torch.Tensor, torch.Tensor]]


# ---------------------------------------------------------------------------
# Layouts: which global chunks a rank holds
# ---------------------------------------------------------------------------


def chunks_of(rank: int, world: int, layout: str) -> list[int]:
    """The global chunk indices rank ``rank`` holds, in the order they sit in its shard
    (``world`` chunks for contiguous, ``2 * world`` for zigzag)."""
    if layout == "contiguous":
        return [rank]
    if layout == "zigzag":
        return [rank, 2 * world - 1 - rank]
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def shard(x: torch.Tensor, dim: int, rank: int, world: int, layout: str = "contiguous"):
    """Rank ``rank``'s shard of the full ``x`` along ``dim`` (the sequence axis)."""
    n = len(chunks_of(0, world, layout)) * world  # chunks in all
    if x.shape[dim] % n:
        raise ValueError(
            f"a sequence of {x.shape[dim]} positions does not split into {n} equal chunks "
            f"({layout}, {world} ranks)"
        )
    pieces = x.chunk(n, dim=dim)
    return torch.cat([pieces[c] for c in chunks_of(rank, world, layout)], dim=dim)


def unshard(shards: list[torch.Tensor], dim: int, layout: str = "contiguous") -> torch.Tensor:
    """The full tensor from every rank's shard (``shards[r]`` from rank ``r``)."""
    world = len(shards)
    per = len(chunks_of(0, world, layout))
    placed: dict[int, torch.Tensor] = {}
    for rank, piece in enumerate(shards):
        for c, part in zip(chunks_of(rank, world, layout), piece.chunk(per, dim=dim), strict=True):
            placed[c] = part
    return torch.cat([placed[c] for c in sorted(placed)], dim=dim)


# ---------------------------------------------------------------------------
# One block: a chunk of queries against a chunk of keys
# ---------------------------------------------------------------------------


def _block(attention: Attention, q, k, v, valid, diagonal: bool):
    """``(out, lse)`` of queries ``q (B,H,Tc,Dh)`` against one key chunk, ``valid (B,Tc)``.

    ``diagonal``: the chunks are the same positions, so causal within the block.
    A query row may see no key of *this* block (all padding, or before its first
    real key): such rows attend to key 0 instead, a finite stand-in, and get
    ``lse = -inf``, so they weigh nothing in the merge and receive no gradient.
    """
    allowed = valid[:, None, None, :]  # (B,1,1,Tc)
    if diagonal:
        Tc = q.shape[-2]
        tri = torch.ones(Tc, Tc, dtype=torch.bool, device=q.device).tril()  # j <= i
        allowed = allowed & tri  # (B,1,Tc,Tc)
    empty = ~allowed.any(-1)  # (B,1,Tq): rows with no key in this block
    if not bool(empty.any()):
        mask = None if bool(valid.all()) else valid[:, None, None, :]
        return attention(q, k, v, causal=diagonal, mask=mask, return_lse=True)
    first = torch.zeros(allowed.shape[-1], dtype=torch.bool, device=q.device)
    first[0] = True
    allowed = allowed | (empty[..., None] & first)  # (B,1,Tq,Tc): key 0 for the empty rows
    out, lse = attention(q, k, v, mask=allowed, return_lse=True)
    return out, torch.where(empty, float("-inf"), lse)  # lse (B,H,Tq)


def _visible(q_chunk: int, k_chunk: int, causal: bool) -> str | None:
    """How a query chunk sees a key chunk: ``"full"``, ``"diagonal"`` or not at all (None)."""
    if not causal or k_chunk < q_chunk:
        return "full"
    return "diagonal" if k_chunk == q_chunk else None


def _merge(parts):
    """``[(out_i, lse_i), ...]`` over disjoint keys -> ``(out, lse)`` over their union."""
    from .level2_torch_manual import merge_attention

    return merge_attention(parts)


# ---------------------------------------------------------------------------
# The checks every rank makes alike
# ---------------------------------------------------------------------------


def _world(group) -> tuple[int, int]:
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised: call init_process_group first")
    return dist.get_rank(group), dist.get_world_size(group)


def _key_padding(mask, B: int, T: int, device) -> torch.Tensor:
    """This rank's key padding ``(B, T)`` from ``mask``: None (every key real), ``(B, T)``,
    or ``attention()``'s form ``(B, 1, 1, T)``. Another shape is a ``ValueError``: a mask
    that varies over heads or queries is not a key padding mask."""
    if mask is None:
        return torch.ones(B, T, dtype=torch.bool, device=device)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be boolean (True = a real key), got {mask.dtype}")
    if tuple(mask.shape) == (B, 1, 1, T):
        return mask[:, 0, 0, :]  # (B, T)
    if tuple(mask.shape) != (B, T):
        raise ValueError(
            f"mask is a key padding mask of this rank's keys, (B, T/W) = {(B, T)} or "
            f"(B, 1, 1, T/W) = {(B, 1, 1, T)}; got {tuple(mask.shape)}"
        )
    return mask


def _check(q, k, v, mask, causal, layout, group):
    """Shapes, equal shards, and no empty query row anywhere: -> ``valid (B, Tl)``, this
    rank's key padding, and ``full (B, T)``, every rank's in global order."""
    from .level2_torch_manual.attention import check_inputs

    rank, world = _world(group)
    B, H, T, S, _, _ = check_inputs(q, k, v, None)
    if T != S:
        raise ValueError(f"each rank holds the same positions of q, k and v; got T={T}, S={S}")
    chunks_of(rank, world, layout)  # the layout's name
    if layout == "zigzag" and T % 2:
        raise ValueError(f"zigzag holds two chunks per rank: the shard length {T} must be even")
    valid = _key_padding(mask, B, T, q.device)  # (B, Tl)
    # Every rank sees every shard's length and validity, so all decide the same.
    lengths = [torch.zeros(2, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(lengths, torch.tensor([B, T]), group=group)
    if any(tuple(x.tolist()) != (B, T) for x in lengths):
        raise ValueError(
            f"every rank must hold a shard of the same shape; got (B, T/W) = "
            f"{[tuple(x.tolist()) for x in lengths]}"
        )
    gathered = [torch.empty(B, T, dtype=torch.uint8, device=valid.device) for _ in range(world)]
    dist.all_gather(gathered, valid.to(torch.uint8).contiguous(), group=group)
    full = unshard(gathered, 1, layout).bool()  # (B, T * W) in global order
    seen = full.cumsum(1) > 0 if causal else full.any(1, keepdim=True).expand_as(full)
    if not bool(seen.all()):
        raise ValueError(EMPTY_ROW_MESSAGE)  # on every rank: they all hold `full`
    return valid, full


def _default_attention(attention: Attention | None) -> Attention:
    if attention is not None:
        return attention
    from .level3_sdpa_flash import attention as level3_attention

    return level3_attention


# ---------------------------------------------------------------------------
# All-gather: every rank holds every key
# ---------------------------------------------------------------------------


class _Gather(torch.autograd.Function):
    """Every rank's ``x``, as a tuple in rank order; the backward hands each rank the sum
    over ranks of the gradient of its own piece (an all-reduce, which gloo has)."""

    @staticmethod
    def forward(ctx, x, group):
        _, world = _world(group)
        pieces = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(world)]
        dist.all_gather(pieces, x.contiguous(), group=group)
        ctx.group = group
        return tuple(pieces)

    @staticmethod
    def backward(ctx, *grads):
        rank, _ = _world(ctx.group)
        total = torch.stack([torch.zeros_like(grads[rank]) if g is None else g for g in grads])
        dist.all_reduce(total, group=ctx.group)  # (W, ...): every rank's gradient of each piece
        return total[rank], None


def allgather_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    mask: torch.Tensor | None = None,
    group=None,
    attention: Attention | None = None,
    layout: str = "contiguous",
) -> torch.Tensor:
    """This rank's ``q (B,H,Tl,Dh)`` against the keys of every rank: ``(B,H,Tl,Dv)``.

    ``k, v (B,Hkv,Tl,·)`` and ``mask (B,Tl)`` or ``(B,1,1,Tl)`` (True = real key) are
    this rank's shards. They are gathered (``_Gather``, whose backward sends each
    rank the gradient of its shard) and each local chunk of queries attends to the
    keys up to its own last position (causal) or to all of them.
    """
    attention = _default_attention(attention)
    _, full = _check(q, k, v, mask, causal, layout, group)  # full (B, T)
    rank, world = _world(group)
    K = unshard(list(_Gather.apply(k, group)), 2, layout)  # (B,Hkv,T,Dh)
    V = unshard(list(_Gather.apply(v, group)), 2, layout)
    mine = chunks_of(rank, world, layout)
    Tc = q.shape[2] // len(mine)
    outs = []
    for i, c in enumerate(mine):
        qc = q[:, :, i * Tc : (i + 1) * Tc]
        end = (c + 1) * Tc if causal else K.shape[2]  # the keys this chunk may see
        keys = full[:, :end]
        m = None if bool(keys.all()) else keys[:, None, None, :]
        # Bottom-right causal over [0, end): the chunk's queries are the last Tc positions.
        outs.append(attention(qc, K[:, :, :end], V[:, :, :end], causal=causal, mask=m))
    return torch.cat(outs, dim=2)  # (B,H,Tl,Dv)


# ---------------------------------------------------------------------------
# The ring
# ---------------------------------------------------------------------------


def _pass_on(tensors: list[torch.Tensor], group) -> tuple[list[torch.Tensor], list]:
    """Send ``tensors`` to the next rank and receive the previous rank's into new buffers;
    -> ``(buffers, requests)``. The transfers run while the caller computes."""
    rank, world = _world(group)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    if group is not None:
        nxt, prv = dist.get_global_rank(group, nxt), dist.get_global_rank(group, prv)
    tensors = [t.contiguous() for t in tensors]
    buffers = [torch.empty_like(t) for t in tensors]
    ops = [dist.P2POp(dist.isend, t, nxt, group) for t in tensors]
    ops += [dist.P2POp(dist.irecv, b, prv, group) for b in buffers]
    return buffers, dist.batch_isend_irecv(ops)


def _wait(requests) -> None:
    for request in requests:
        request.wait()


class _Ring(torch.autograd.Function):
    """Ring attention's forward and backward (the hops as described in the module docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, valid, causal, layout, group, attention):
        rank, world = _world(group)
        mine = chunks_of(rank, world, layout)
        n = len(mine)
        qs = q.chunk(n, dim=2)  # this rank's query chunks, (B,H,Tc,Dh) each
        parts: list[list] = [[] for _ in mine]
        block = [k, v, valid.to(torch.uint8)]  # what travels: K, V and their validity
        for hop in range(world):
            src = (rank - hop) % world
            if hop < world - 1:
                incoming, requests = _pass_on(block, group)  # overlapped with this hop's work
            ks, vs, vals = (x.chunk(n, dim=2 if x.dim() == 4 else 1) for x in block)
            for i, a in enumerate(mine):
                for j, c in enumerate(chunks_of(src, world, layout)):
                    how = _visible(a, c, causal)
                    if how is not None:
                        parts[i].append(
                            _block(
                                attention, qs[i], ks[j], vs[j], vals[j].bool(), how == "diagonal"
                            )
                        )
            if hop < world - 1:
                _wait(requests)
                block = incoming
        merged = [_merge(p) for p in parts]  # every chunk sees its own diagonal: never empty
        out = torch.cat([o for o, _ in merged], dim=2)  # (B,H,Tl,Dv)
        lse = torch.cat([lse for _, lse in merged], dim=2)  # (B,H,Tl)
        ctx.save_for_backward(q, k, v, valid, out, lse)
        ctx.causal, ctx.layout, ctx.group, ctx.attention = causal, layout, group, attention
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, valid, out, lse = ctx.saved_tensors
        causal, layout, group, attention = ctx.causal, ctx.layout, ctx.group, ctx.attention
        rank, world = _world(group)
        mine = chunks_of(rank, world, layout)
        n = len(mine)
        qs, outs, lses, d_outs = (x.chunk(n, dim=2) for x in (q, out, lse, d_out))
        dq = torch.zeros_like(q)
        dqs = dq.chunk(n, dim=2)  # views: adding into them fills dq
        # K, V and validity travel as in the forward; dK and dV travel with them.
        block = [k, v, valid.to(torch.uint8), torch.zeros_like(k), torch.zeros_like(v)]
        for hop in range(world):
            src = (rank - hop) % world
            ks, vs, vals = (x.chunk(n, dim=2 if x.dim() == 4 else 1) for x in block[:3])
            dks, dvs = block[3].chunk(n, dim=2), block[4].chunk(n, dim=2)
            for i, a in enumerate(mine):
                for j, c in enumerate(chunks_of(src, world, layout)):
                    how = _visible(a, c, causal)
                    if how is None:
                        continue
                    with torch.enable_grad():
                        leaves = [x.detach().requires_grad_() for x in (qs[i], ks[j], vs[j])]
                        o, s = _block(attention, *leaves, vals[j].bool(), how == "diagonal")
                        # The merge's chain rule: out = sum_i w_i out_i with w_i = exp(lse_i - lse):
                        # d out_i = w_i d_out, d lse_i = w_i (out_i - out) . d_out.
                        w = torch.exp(s - lses[i]).detach()  # (B,H,Tc); 0 where s = -inf
                        g_out = w[..., None] * d_outs[i]
                        g_lse = w * ((o.detach() - outs[i]) * d_outs[i]).sum(-1)
                        grads = torch.autograd.grad((o, s), leaves, (g_out, g_lse))
                    dqs[i].add_(grads[0])
                    dks[j].add_(grads[1])
                    dvs[j].add_(grads[2])
            if hop < world - 1:
                incoming, requests = _pass_on(block, group)
                _wait(requests)
                block = incoming
        # The last hop's dK, dV belong to the next rank's block: one more step home.
        if world > 1:
            home, requests = _pass_on(block[3:], group)
            _wait(requests)
            dk, dv = home
        else:
            dk, dv = block[3], block[4]
        return dq, dk, dv, None, None, None, None, None


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    mask: torch.Tensor | None = None,
    group=None,
    attention: Attention | None = None,
    layout: str = "contiguous",
) -> torch.Tensor:
    """This rank's ``q (B,H,Tl,Dh)`` against the keys of every rank, passed around a ring.

    ``k, v (B,Hkv,Tl,·)`` and ``mask (B,Tl)`` or ``(B,1,1,Tl)`` (True = real key) are
    this rank's shards in ``layout``; ``attention`` computes one block with
    ``return_lse=True`` (default: level 3's; any torch level's works).
    Differentiable in ``q``, ``k`` and ``v``. Returns ``(B,H,Tl,Dv)``.
    """
    attention = _default_attention(attention)
    valid, _ = _check(q, k, v, mask, causal, layout, group)
    return _Ring.apply(q, k, v, valid, bool(causal), layout, group, attention)


# ---------------------------------------------------------------------------
# A model over a sharded sequence (context parallelism)
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def context_parallel(
    model: torch.nn.Module,
    *,
    group=None,
    attention: Attention | None = None,
    method: str = "ring",
) -> Iterator[None]:
    """Inside the block, the self-attention of a torch level's ``model`` attends across
    the ranks' shards (``method``: ``"ring"`` or ``"allgather"``), each block computed by
    ``attention`` (default: level 3's). The model's ``kernels`` hook is swapped for
    the block and restored after; nothing else of the model changes.

    Run the model with each rank's contiguous shard of the tokens and
    ``position_offset = rank * T/W`` (``sharded_forward`` does both).
    """
    sharded_attention = {"ring": ring_attention, "allgather": allgather_attention}.get(method)
    if sharded_attention is None:
        raise ValueError(f"method must be 'ring' or 'allgather', got {method!r}")

    if getattr(model.config, "window", None) is not None:
        raise ValueError("context parallelism here has no sliding window")

    def across_ranks(q, k, v, *, mask=None, dropout_p=0.0, **_):
        if dropout_p > 0.0:
            raise ValueError("context parallelism here has no attention dropout")
        # The model's mask is this shard's own, (B,1,T,T) by position: causal, its padded
        # keys hidden. Across the ranks the rule is the same, causal by the global index
        # (each shard is contiguous, its positions rank * T/W + t) over the real keys,
        # which the mask's diagonal marks (a real token sees itself, a padded one not;
        # slot 0 of a shard of padding alone is marked too, seen only by padded queries).
        # No mask: the shard's positions were in place (semantics.told), every key real.
        real = None if mask is None else mask.diagonal(dim1=-2, dim2=-1)[:, :, None, :]  # (B,1,1,T)
        return sharded_attention(q, k, v, causal=True, mask=real, group=group, attention=attention)

    hooked = [m for m in model.modules() if hasattr(m, "kernels")]
    saved = [(m, m.__dict__.get("kernels")) for m in hooked]  # instance values, if any
    for m in hooked:
        m.kernels = replace(m.kernels, attention=across_ranks)
    try:
        yield
    finally:
        for m, kernels in saved:
            if kernels is None:
                del m.kernels  # back to the class's
            else:
                m.kernels = kernels


def sharded_forward(model, tokens: torch.Tensor, *, valid=None, group=None, **options):
    """This rank's logits ``(B, T/W, V)`` for its contiguous shard ``tokens (B, T/W)`` of a
    sequence of ``T`` tokens, through ``context_parallel(model, **options)``."""
    rank, _ = _world(group)
    with context_parallel(model, group=group, **options):
        return model(tokens, valid=valid, position_offset=rank * tokens.shape[1])
