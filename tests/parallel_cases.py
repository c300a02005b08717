"""What each rank runs in tests/test_parallel.py (spawned processes import it by name).

Every rank builds the same full tensors from one seed, takes its shard, runs the
sharded computation, and compares its shard of the result with single-process
float64 attention (or the single-process model) on the full tensors. The worst
errors go to ``out_dir/rank{r}.json``; an assertion stops the rank, and the
spawning test reports it.
"""

from __future__ import annotations

import json
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


def start(rank: int, world: int, rendezvous: str) -> None:
    torch.set_num_threads(1)
    distributed.join_group(rank, world, rendezvous, timeout=timedelta(seconds=60))


def full_inputs(seed, B, H, Hkv, T, Dh, padded):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, Dh, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, Hkv, T, Dh, generator=g, dtype=torch.float64) for _ in range(2))
    d_out = torch.randn(B, H, T, Dh, generator=g, dtype=torch.float64)
    valid = torch.ones(B, T, dtype=torch.bool)
    if padded:  # row 1 right-padded past its first third; row 0 real throughout
        valid[1, T // 3 :] = False
    return q, k, v, d_out, valid


def attention_cases(rank: int, world: int, rendezvous: str, out_dir: str) -> None:
    start(rank, world, rendezvous)
    L2 = levels.load("level2_torch_manual")
    L3 = levels.load("level3_sdpa_flash")
    worst: dict[str, float] = {}
    T = 4 * world * 3  # 12 positions per rank, 6 per zigzag chunk
    try:
        for causal in (False, True):
            for padded in (False, True):
                # The single-process float64 truth, once for every layout, method and block.
                q, k, v, d_out, valid = full_inputs(7, 2, 4, 2, T, 8, padded)
                leaves = [x.clone().requires_grad_() for x in (q, k, v)]
                want = L2.attention(*leaves, causal=causal, mask=valid[:, None, None, :])
                grads = torch.autograd.grad(want, leaves, d_out)
                for layout in parallel.LAYOUTS:
                    for method in ("ring", "allgather"):
                        for local in (L2, L3):
                            mine = [
                                parallel.shard(x, 2, rank, world, layout).requires_grad_()
                                for x in (q, k, v)
                            ]
                            fn = (
                                parallel.ring_attention
                                if method == "ring"
                                else parallel.allgather_attention
                            )
                            got = fn(
                                *mine,
                                causal=causal,
                                mask=parallel.shard(valid, 1, rank, world, layout),
                                attention=local.attention,
                                layout=layout,
                            )
                            my_grads = torch.autograd.grad(
                                got, mine, parallel.shard(d_out, 2, rank, world, layout)
                            )
                            name = f"{method} {layout} causal={causal} padded={padded} {local.__name__.split('.')[-1]}"
                            errors = [
                                (got - parallel.shard(want, 2, rank, world, layout)).abs().max()
                            ]
                            errors += [
                                (g - parallel.shard(w, 2, rank, world, layout)).abs().max()
                                for g, w in zip(my_grads, grads, strict=True)
                            ]
                            worst[name] = max(float(e.detach()) for e in errors)
                            assert worst[name] < F64_TOL, (name, [float(e) for e in errors])
        dist.barrier()  # nobody tears the group down while another rank still talks
    finally:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(worst))
        dist.destroy_process_group()
    distributed.leave(0)  # done: past gloo's teardown at exit, which can abort a rank


def model_case(rank: int, world: int, rendezvous: str, out_dir: str) -> None:
    """The decoder-only model over a sharded sequence: logits, loss and gradients."""
    from levels import TransformerConfig, init_params

    start(rank, world, rendezvous)
    worst: dict[str, float] = {}
    try:
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
        for method in ("ring", "allgather"):
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
        dist.barrier()  # nobody tears the group down while another rank still talks
    finally:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(worst))
        dist.destroy_process_group()
    distributed.leave(0)  # done: past gloo's teardown at exit, which can abort a rank


def refusal_case(rank: int, world: int, rendezvous: str, out_dir: str) -> None:
    """Shards of different lengths, and a row with no key anywhere: the same error on every rank."""
    start(rank, world, rendezvous)
    messages = {}
    try:
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
        dist.barrier()
    finally:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(messages))
        dist.destroy_process_group()
    distributed.leave(0)  # done: past gloo's teardown at exit, which can abort a rank


def resume_spec():
    from lab.train import default_spec

    return default_spec("seq2seq", "reverse", quick=True, steps=30)


def train_part_case(rank: int, world: int, rendezvous: str, out_dir: str) -> None:
    """Train the first 15 of 30 steps data-parallel and leave the checkpoint (rank 0 writes it)."""
    from lab.train import train

    start(rank, world, rendezvous)
    try:
        result = train(
            resume_spec(),
            levels.load("level2_torch_manual"),
            checkpoint=Path(out_dir, "run.pt"),
            stop_after=15,
            evaluation=False,
            world=distributed.World(rank, world),
        )
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"losses": result["losses"]}))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    distributed.leave(0)  # done: past gloo's teardown at exit, which can abort a rank
