"""The paged KV cache (levels/level2_torch_manual/paged.py) over the engine's block manager
(engine/blocks.py): a pool of blocks, a table per sequence, and the prefix index, against
each row decoded alone by the model's own cache.

Levels 2 and 3 in float64 (the batch changes only the order of sums), level 4 in float32
through Triton's interpreter (its dtype here), small models throughout.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import load_or_skip

from engine.blocks import BlockPool, OutOfBlocks, Table
from levels import TransformerConfig, init_params
from levels.level2_torch_manual.paged import PagedKVCache

LEVELS = [("level2_torch_manual", torch.float64), ("level3_sdpa_flash", torch.float64),
          ("level4_triton_kernel", torch.float32)]  # fmt: skip
# float64: the same sums in another order (a batch of rows, a gathered cache) agree to
# rounding; float32 through the interpreter's blocked kernel: its usual bound.
ATOL = {torch.float64: 1e-12, torch.float32: 2e-5}


def _model(name: str, dtype, **options):
    config = TransformerConfig(vocab_size=30, d_model=16, n_heads=4, n_kv_heads=2, n_layers=2,
                               d_ff=32, max_seq_len=32, **options)  # fmt: skip
    params = init_params(config, "decoder_only", seed=3, scheme="random")
    return config, load_or_skip(name).DecoderOnlyTransformer(config, params, dtype=dtype)


def _new_pool(config, blocks, block_size, dtype=None) -> BlockPool:
    """A pool of ``blocks`` over level 2's storage of them."""
    storage = PagedKVCache.storage(config, blocks, block_size, dtype=dtype)
    return BlockPool(*storage, blocks, block_size)


def _scattered_pool(config, dtype, blocks=24, block_size=4) -> BlockPool:
    """A pool whose blocks are handed out out of order, so no table is a run of blocks."""
    pool = _new_pool(config, blocks, block_size, dtype)
    order = np.random.default_rng(0).permutation(blocks).tolist()
    pool.free_blocks.clear()
    pool.free_blocks.extend(order)
    return pool


# Level 4 with the window only: it has both code paths. Under Triton's interpreter its run
# (6 s) is extended; test_the_paged_kernel_reads_through_the_table... keeps the kernel's own
# check in the default run.
ROWS_CASES = [(n, d, w) for n, d in LEVELS for w in ([3] if n.startswith("level4") else [None, 3])]


@pytest.mark.parametrize(("name", "dtype", "window"), ROWS_CASES,
                         ids=[f"{n}-window{w}" for n, _, w in ROWS_CASES])  # fmt: skip
@pytest.mark.interpreter_extended()
def test_paged_rows_decode_as_each_row_alone(name, dtype, window, monkeypatch):
    """Three prompts of 9, 2 and 5 tokens prefilled in one right-padded pass into scattered
    blocks (block size 4: rows end mid-block and cross blocks while decoding), decoded
    together, then row 1 leaves, a fourth prompt joins, and the batch is reordered: every
    logit that of its row alone through the model's own cache, with a sliding window too.
    Level 4's decode steps read the blocks through its paged kernel."""
    config, model = _model(name, dtype, window=window)
    pool = _scattered_pool(config, dtype)
    paged = model.kernels.paged_kv_cache  # the level's: level 4's decodes through its kernel
    kernel_calls = []
    if name == "level4_triton_kernel":
        models = __import__("levels.level4_triton_kernel.models", fromlist=["paged_decode"])
        kernel = models.paged_decode
        monkeypatch.setattr(
            models, "paged_decode", lambda *a, **kw: kernel_calls.append(1) or kernel(*a, **kw)
        )
    prompts = [[3, 4, 5, 6, 7, 8, 9, 10, 11], [9, 10], [11, 12, 13, 14, 15], [20, 21, 22]]
    feed = [[15 + i + r for i in range(8)] for r in range(4)]
    with torch.no_grad():
        want = []  # each row alone: its prefill's last logits, then each decode step's
        for prompt, tokens in zip(prompts, feed, strict=True):
            logits, cache = model.prefill(torch.tensor([prompt]), last_only=True)
            want.append([logits[0]] + [model.decode_step(torch.tensor([t]), cache)[0]
                                       for t in tokens])  # fmt: skip
        seqs = [Table() for _ in prompts]
        got = [[] for _ in prompts]

        def prefill(rows):
            T = max(len(prompts[r]) for r in rows)
            ids = torch.tensor([prompts[r] + [0] * (T - len(prompts[r])) for r in rows])
            valid = torch.tensor([[t < len(prompts[r]) for t in range(T)] for r in rows])
            cache = paged(pool, [seqs[r] for r in rows], config)
            for b, logits in enumerate(model.extend(ids, cache, valid=valid, last_only=True)):
                got[rows[b]].append(logits)

        def decode(rows, steps):
            for _ in range(steps):
                tokens = torch.tensor([feed[r][len(got[r]) - 1] for r in rows])
                logits = model.decode_step(tokens, paged(pool, [seqs[r] for r in rows], config))
                for b, r in enumerate(rows):
                    got[r].append(logits[b])

        prefill([0, 1, 2])
        decode([0, 1, 2], 3)
        pool.free(seqs[1])  # row 1 leaves; its blocks go back
        prefill([3])
        decode([3, 2, 0], 4)
    tables = [seq.table for seq in (seqs[0], seqs[2], seqs[3])]
    assert any(t != list(range(t[0], t[0] + len(t))) for t in tables)  # blocks out of order
    for r in range(4):
        assert len(got[r]) >= 4
        for i, (step_got, step_want) in enumerate(zip(got[r], want[r], strict=False)):
            torch.testing.assert_close(step_got, step_want, atol=ATOL[dtype], rtol=0,
                                       msg=lambda m, r=r, i=i: f"row {r} step {i}: {m}")  # fmt: skip
    if name == "level4_triton_kernel":  # every decode step of every layer through the kernel
        assert len(kernel_calls) == 7 * config.n_layers
    for r in (0, 2, 3):
        pool.free(seqs[r])
    assert pool.available == pool.blocks and not any(pool.refs)


@pytest.mark.parametrize("name", ["level2_torch_manual", "level3_sdpa_flash"])
def test_one_row_through_the_paged_cache_is_the_model_s_own_cache_bit_for_bit(name):
    """One row alone (no padding, so the same shapes and sums as the model's own cache):
    its prefill's and five decode steps' logits identical in float64, across block edges."""
    config, model = _model(name, torch.float64)
    pool, seq = _scattered_pool(config, torch.float64), Table()
    paged = model.kernels.paged_kv_cache
    with torch.no_grad():
        prompt = torch.tensor([[3, 4, 5, 6, 7, 8, 9]])
        want, cache = model.prefill(prompt, last_only=True)
        got = model.extend(prompt, paged(pool, [seq], config), last_only=True)
        assert torch.equal(got, want)
        for t in (10, 11, 12, 13, 14):
            want = model.decode_step(torch.tensor([t]), cache)
            assert torch.equal(
                model.decode_step(torch.tensor([t]), paged(pool, [seq], config)), want
            )


def _pool(blocks=6, block_size=4) -> BlockPool:
    config = TransformerConfig(vocab_size=30, d_model=8, n_heads=2, d_ff=8, n_layers=1)
    return _new_pool(config, blocks, block_size)


def test_a_step_takes_all_its_blocks_or_none():
    pool = _pool(blocks=3)
    a, b = Table(), Table()
    pool.reserve([a], 5)  # 5 positions: 2 blocks of 4
    assert len(a.table) == 2 and pool.available == 1
    with pytest.raises(OutOfBlocks, match="needs 2 more KV blocks and the pool has 1 free"):
        pool.reserve([a, b], 5)  # a's two blocks hold 5 already; b needs two
    assert len(a.table) == 2 and b.table == [] and pool.available == 1  # nothing was taken
    a.count = 4
    pool.reserve([a], 4)  # positions 4-7: the second block holds them, nothing new
    assert len(a.table) == 2 and pool.available == 1
    pool.reserve([a], 5)  # positions 4-8: one more block, exactly what is left
    assert len(a.table) == 3 and pool.available == 0
    pool.free(a)
    assert pool.available == 3 and a.table == [] and a.count == 0


def test_a_paged_step_must_be_right_padded_and_is_checked_before_it_counts():
    config, model = _model("level2_torch_manual", torch.float64)
    pool = _new_pool(config, 8, 4, torch.float64)
    seq = Table()
    with torch.no_grad():
        model.extend(torch.tensor([[5, 6]]), PagedKVCache(pool, [seq], config))
        with pytest.raises(ValueError, match="right-padded"):
            model.extend(torch.tensor([[0, 7, 8]]), PagedKVCache(pool, [seq], config),
                         valid=torch.tensor([[False, True, True]]))  # fmt: skip
    assert seq.count == 2  # the step's blocks were taken; none of its positions counts


def _filled(pool, tokens) -> Table:
    """A sequence that has computed ``tokens`` (its keys are not the point here)."""
    seq = pool.match(tokens[:-1])
    pool.reserve([seq], len(tokens) - seq.count)
    seq.count = len(tokens)
    pool.publish(seq, tokens)
    return seq


def test_the_prefix_index_finds_whole_blocks_of_the_same_tokens_after_the_same_prefix():
    pool = _pool(blocks=12, block_size=4)
    system = list(range(1, 10))  # 9 tokens: two whole blocks and one more
    first = _filled(pool, system + [20, 21])
    assert len(first.digests) == 2  # two full blocks filed, the third (3 of 4) not
    again = pool.match(system + [22, 23, 24])  # the same two blocks, held twice now
    assert again.table == first.table[:2] and again.count == 8
    assert [pool.refs[b] for b in again.table] == [2, 2]
    # The second block's tokens after a different first block: a different prefix.
    other = pool.match([9, 9, 9, 9] + system[4:8])
    assert other.table == [] and other.count == 0
    # A prompt of exactly two blocks matches at most what its last token leaves (the
    # engine passes all but the last token: its logits are needed).
    exact = pool.match(system[:8][:-1])
    assert exact.count == 4
    table = first.table[:2]
    for seq in (exact, again, first):
        pool.free(seq)
    assert pool.available == 12 and not any(pool.refs)
    # Idle, the blocks keep their prefix: a later request still finds it.
    later = pool.match(system)
    assert later.count == 8 and later.table == table
    pool.free(later)


def test_idle_prefix_blocks_are_reused_least_recently_freed_first_and_forgotten():
    pool = _pool(blocks=4, block_size=2)
    a = _filled(pool, [1, 2, 3])  # blocks: [1,2] published, [3] not
    b = _filled(pool, [5, 6, 7])
    pool.free(a)  # a's published block idle first, then b's
    pool.free(b)
    assert pool.available == 4
    c = Table()
    pool.reserve([c], 6)  # 3 blocks: the two never-published first, then a's idle one
    assert pool.match([1, 2, 3]).count == 0  # a's prefix forgotten: its block was rewritten
    kept = pool.match([5, 6, 7])
    assert kept.count == 2  # b's, freed later, is still there
    pool.free(kept)
    pool.free(c)
    assert pool.available == 4 and not any(pool.refs)


def test_a_freed_prefix_gives_back_its_tail_first_so_its_head_outlives_it():
    """A sequence of three full published blocks and a partial one leaves; then the pool is
    short of blocks and a new sequence takes two. Given back tail first, the idle blocks
    taken are the prefix's last ones, and its head (what every match starts from) is still
    found: its first two blocks, 8 positions. Given back head first, the head would go first
    and nothing of the prefix could be found again."""
    pool = _pool(blocks=4, block_size=4)
    tokens = list(range(1, 15))  # 14 tokens: blocks of 4, 4, 4 published, then 2 more
    first = _filled(pool, tokens)
    assert len(first.digests) == 3 and pool.available == 0
    pool.free(first)
    taker = Table()
    pool.reserve([taker], 8)  # two blocks: the unpublished one, then the oldest idle one
    assert pool.match(tokens).count == 8  # the first two blocks, still filed


@pytest.mark.parametrize("window", [None, 1, 5])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)], ids=["mha", "gqa", "mqa"])
def test_the_paged_kernel_reads_through_the_table_as_attention_reads_the_keys_gathered(
    window, heads, device
):
    """Level 4's paged decode kernel (Triton's interpreter) against level 2's attention over
    each row's keys gathered by hand: rows of 1 key, of exactly one and two whole blocks (the
    last key a block's last slot), and mid-block; tables scattered and padded past a row's
    blocks with entries it must not read (NaN blocks); a head width that pads (24 -> 32);
    windows of 1 (the query's own key only) and 5 (crossing a block edge). On ``--device
    cuda``, the compiled kernel."""
    level4 = load_or_skip("level4_triton_kernel")
    from levels.level2_torch_manual.attention import attention
    from levels.level4_triton_kernel.paged_decode import paged_decode

    H, Hkv = heads
    N, BS, Dh = 12, 4, 24
    g = torch.Generator().manual_seed(0)
    k_pool, v_pool = (
        torch.randn(N, Hkv, BS, Dh, generator=g),
        torch.randn(N, Hkv, BS, Dh, generator=g),
    )
    poison = [11, 10]  # never in a row's own blocks: NaN, so reading one shows
    k_pool[poison], v_pool[poison] = float("nan"), float("nan")
    counts = [1, 4, 8, 6]
    tables = [[7], [2], [9, 0], [5, 3]]
    padded = [t + poison[: 2 - len(t)] for t in tables]  # (B, 2)
    q = torch.randn(len(counts), H, 1, Dh, generator=g)
    on = {"device": device, "dtype": torch.int32}
    got = paged_decode(
        q.to(device),
        k_pool.to(device),
        v_pool.to(device),
        torch.tensor(padded, **on),
        torch.tensor(counts, **on),
        window=window,
    )
    got = got.cpu()  # fmt: skip
    assert level4 is not None and got.shape == q.shape
    for b, (count, table) in enumerate(zip(counts, tables, strict=True)):
        k = torch.cat([k_pool[i] for i in table], dim=1)[None, :, :count]  # (1,Hkv,count,Dh)
        v = torch.cat([v_pool[i] for i in table], dim=1)[None, :, :count]
        want = attention(q[b : b + 1], k, v, causal=True, window=window)  # (1,H,1,Dh)
        # float32 sums in another order (the online softmax, block by block).
        torch.testing.assert_close(got[b : b + 1], want, atol=2e-6, rtol=2e-6)
