"""What each rank runs in tests/test_parallel.py (spawned processes import it by name).

Each case is ``fn(rank, world, ...) -> dict``, run on every rank by
``lab.distributed.spawn``, which joins the process group around it and hands the
dicts back. Every rank builds the same full tensors from one seed, takes its
shard, runs the sharded computation, and compares its shard of the result with
single-process float64 attention (or the single-process model) on the full
tensors; it returns its worst errors. An assertion stops the rank, and the
spawning test reports it.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

import levels
from lab import distributed
from levels import parallel

# float64 blocks merged by log-sum-exp against one float64 softmax: only the order of
# the sums differs (a few ulps of O(1) values), so 1e-12 catches any misplaced block.
F64_TOL = 1e-12
TIMEOUT = timedelta(seconds=60)  # any collective: the cases take a few seconds
METHODS = {"ring": parallel.ring_attention, "allgather": parallel.allgather_attention}
# The key padding mask in the two forms the sharded attentions take: (B, T/W) and
# attention()'s own (B, 1, 1, T/W).
MASK_FORMS = {"(B,S)": lambda valid: valid, "(B,1,1,S)": lambda valid: valid[:, None, None, :]}


def full_inputs(seed, B, H, Hkv, T, Dh, padded):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, Dh, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, Hkv, T, Dh, generator=g, dtype=torch.float64) for _ in range(2))
    d_out = torch.randn(B, H, T, Dh, generator=g, dtype=torch.float64)
    valid = torch.ones(B, T, dtype=torch.bool)
    if padded:  # row 1 right-padded past its first third; row 0 real throughout
        valid[1, T // 3 :] = False
    return q, k, v, d_out, valid


def attention_cases(rank: int, world: int) -> dict[str, float]:
    L2 = levels.load("level2_torch_manual")
    L3 = levels.load("level3_sdpa_flash")
    worst: dict[str, float] = {}
    T = 4 * world * 3  # 12 positions per rank, 6 per zigzag chunk
    for causal in (False, True):
        # Unpadded (an all-True mask), then row 1 padded, in each of the mask's two forms.
        for padded, form in ((False, "(B,S)"), (True, "(B,S)"), (True, "(B,1,1,S)")):
            # The single-process float64 truth, once for every layout, method and block.
            q, k, v, d_out, valid = full_inputs(7, 2, 4, 2, T, 8, padded)
            leaves = [x.clone().requires_grad_() for x in (q, k, v)]
            want = L2.attention(*leaves, causal=causal, mask=valid[:, None, None, :])
            grads = torch.autograd.grad(want, leaves, d_out)
            for layout in parallel.LAYOUTS:
                for method, fn in METHODS.items():
                    for local in (L2, L3):
                        mine = [
                            parallel.shard(x, 2, rank, world, layout).requires_grad_()
                            for x in (q, k, v)
                        ]
                        got = fn(
                            *mine,
                            causal=causal,
                            mask=MASK_FORMS[form](parallel.shard(valid, 1, rank, world, layout)),
                            attention=local.attention,
                            layout=layout,
                        )
                        my_grads = torch.autograd.grad(
                            got, mine, parallel.shard(d_out, 2, rank, world, layout)
                        )
                        name = (
                            f"{method} {layout} causal={causal} padded={padded} mask={form} "
                            f"{local.__name__.split('.')[-1]}"
                        )
                        errors = [(got - parallel.shard(want, 2, rank, world, layout)).abs().max()]
                        errors += [
                            (g - parallel.shard(w, 2, rank, world, layout)).abs().max()
                            for g, w in zip(my_grads, grads, strict=True)
                        ]
                        worst[name] = max(float(e.detach()) for e in errors)
                        assert worst[name] < F64_TOL, (name, [float(e) for e in errors])
    return worst


def model_case(rank: int, world: int) -> dict[str, float]:
    """The decoder-only model over a sharded sequence: logits, loss and gradients."""
    from levels import TransformerConfig, init_params

    worst: dict[str, float] = {}
    L3 = levels.load("level3_sdpa_flash")
    config = TransformerConfig(
        vocab_size=23, d_model=16, n_heads=4, n_kv_heads=2, d_ff=24, n_layers=2, max_seq_len=64
    )
    params = init_params(config, "decoder_only", seed=3, scheme="random")
    T = 6 * world
    tokens = torch.randint(3, 23, (2, T + 1), generator=torch.Generator().manual_seed(3))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    whole = L3.DecoderOnlyTransformer(config, params, dtype=torch.float64)
    logits = whole(inputs)  # (B, T, V)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    loss.backward()
    for method in METHODS:
        model = L3.DecoderOnlyTransformer(config, params, dtype=torch.float64)
        mine = parallel.shard(inputs, 1, rank, world)
        local = parallel.sharded_forward(model, mine, method=method)  # (B, T/W, V)
        # This rank's share of the mean over all B * T targets, summed over the ranks.
        share = (
            torch.nn.functional.cross_entropy(
                local.flatten(0, 1),
                parallel.shard(targets, 1, rank, world).flatten(),
                reduction="sum",
            )
            / targets.numel()
        )
        share.backward()
        total = share.detach().clone()
        dist.all_reduce(total)
        errors = {
            "logits": (local - parallel.shard(logits, 1, rank, world)).abs().max(),
            "loss": (total - loss.detach()).abs(),
        }
        for name, p in model.named_parameters():
            grad = p.grad.clone()
            dist.all_reduce(grad)  # each rank's part of the gradient, summed
            want = dict(whole.named_parameters())[name].grad
            errors[f"grad {name}"] = (grad - want).abs().max()
        worst[f"model {method}"] = max(float(e.detach()) for e in errors.values())
        assert worst[f"model {method}"] < F64_TOL, {k: float(e) for k, e in errors.items()}
    return worst


# Masks that are not a key padding mask of this rank's 4 keys (B = 1): a boolean of the
# wrong shape is refused by name, before any rank waits on a collective.
BAD_MASKS = {
    "(B,T,S)": (1, 4, 4),
    "(B,1,T,S)": (1, 1, 4, 4),
    "(B,H,1,S)": (1, 2, 1, 4),
    "(S,)": (4,),
    "(B,S-1)": (1, 3),
}


def refusal_case(rank: int, world: int) -> dict[str, str]:
    """Shards of different lengths, a row with no key anywhere, and masks of other shapes
    or types: the same error on every rank."""
    messages = {}
    q = torch.zeros(1, 1, 4 + rank, 8, dtype=torch.float64)  # rank 1 holds one more
    try:
        parallel.ring_attention(q, q, q)
    except ValueError as exc:
        messages["uneven"] = str(exc)
    q = torch.zeros(1, 1, 4, 8, dtype=torch.float64)
    valid = torch.zeros(1, 4, dtype=torch.bool)  # no real key on any rank
    try:
        parallel.ring_attention(q, q, q, mask=valid, causal=True)
    except ValueError as exc:
        messages["empty"] = str(exc)
    q = torch.zeros(1, 2, 4, 8, dtype=torch.float64)  # (B, H, T/W, Dh) = (1, 2, 4, 8)
    for method, fn in METHODS.items():
        for name, shape in BAD_MASKS.items():
            try:
                fn(q, q, q, mask=torch.ones(shape, dtype=torch.bool))
            except ValueError as exc:
                messages[f"{method} {name}"] = str(exc)
        try:
            fn(q, q, q, mask=torch.ones(1, 4))  # float, not boolean
        except TypeError as exc:
            messages[f"{method} float"] = str(exc)
    return messages


def resume_spec():
    from lab.train import default_spec

    return default_spec("seq2seq", "reverse", quick=True, steps=30)


def train_part_case(rank: int, world: int, out_dir: str) -> dict[str, list[float]]:
    """Train the first 15 of 30 steps data-parallel and leave the checkpoint (rank 0 writes it)."""
    from lab.train import train

    result = train(
        resume_spec(),
        levels.load("level2_torch_manual"),
        checkpoint=Path(out_dir, "run.pt"),
        stop_after=15,
        evaluation=False,
        world=distributed.World(rank, world),
    )
    return {"losses": result["losses"]}
