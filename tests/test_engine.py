"""The engine's mistakes made visible (engine/): a slot, a position, a rollback, a reference
count off by one must each change something a test reads.

The toy model of these tests is discriminating (``_helpers.discriminating_params``:
untied, its matrices scaled): its greedy tokens depend on every token and every position
of the prompt, which the first test holds, so a wrong slot, position or rollback changes
the text; where tokens cannot tell (a draft's guesses, a block's owners, the compiled
step's slots), the tests read the guesses, the reference counts and the logits.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _helpers import discriminating_params

import levels
from engine import BlockPool, Counts, Engine, ModelDraft, NGramDraft, Request
from levels import TransformerConfig
from levels.common.sampling import Sampling
from levels.level2_torch_manual.paged import PagedKVCache

CONFIG = TransformerConfig(vocab_size=48, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2,
                           d_ff=64, max_seq_len=64, tie_embeddings=False)  # fmt: skip
PROMPT = [17, 5, 33, 40, 8, 21, 12, 45, 9, 30]
NEW = 12


def _model(level: str = "level2_torch_manual", seed: int = 1, noise: float = 0.0, **options):
    """The discriminating toy model at ``level`` in float64; ``noise``: its matrices each
    times ``1 + noise * N(0, 1)`` elementwise, a near copy (a draft right at times)."""
    params = discriminating_params(CONFIG, seed)
    rng = np.random.default_rng(0)
    params = {k: v * (1 + noise * rng.standard_normal(v.shape)) if v.ndim == 2 else v
              for k, v in params.items()}  # fmt: skip
    dtype = np.float64 if level == "level1_numpy" else torch.float64
    return levels.load(level).DecoderOnlyTransformer(CONFIG, params, dtype=dtype, **options)


def _greedy(model, prompt, n=NEW) -> list[int]:
    """The model's greedy continuation of ``prompt``, by the public method."""
    with torch.no_grad():
        out = model.generate(np.array([prompt]), n)
    return np.asarray(model.arrays.to_numpy(out))[0, len(prompt) :].tolist()


def _plain_greedy(model, prompt, n=NEW, gap_at=None) -> list[int]:
    """The greedy continuation by full passes of the plain model, no cache: an independent
    reading of the same function. ``gap_at``: the positions skip one before token
    ``gap_at`` (what a position off by one in a cache or a resumed sequence does)."""
    tokens = list(prompt)
    skip = len(prompt) + n if gap_at is None else gap_at
    with torch.no_grad():
        for _ in range(n):
            positions = [p + (p >= skip) for p in range(len(tokens))]
            out = model.transformer(torch.tensor([tokens]), torch.tensor([positions]))
            tokens.append(int(out[0, -1].argmax()))
    return tokens[len(prompt) :]


def test_the_toy_model_tells_every_token_and_every_position_apart():
    """Changing any one token of the prompt changes the greedy text, and so does a position
    skipped anywhere (RoPE sees only the distances between positions: a gap changes them);
    the text is not one token repeated."""
    model = _model()
    base = _greedy(model, PROMPT)
    assert base == _plain_greedy(model, PROMPT)
    assert len(set(base)) >= 5
    for i in range(len(PROMPT)):
        changed = PROMPT[:i] + [(PROMPT[i] + 11) % CONFIG.vocab_size] + PROMPT[i + 1 :]
        assert _greedy(model, changed) != base, f"token {i} changes nothing"
    for i in range(1, len(PROMPT) + 1):
        assert _plain_greedy(model, PROMPT, gap_at=i) != base, f"a gap before {i} changes nothing"


@pytest.mark.parametrize("rung", ["level1_numpy", "level2_torch_manual", "level3_sdpa_flash"])
def test_a_batch_whose_rows_keep_different_guesses_decodes_each_row_as_alone(rung):
    """A fixed batch over a level's own cache, three rows of different lengths, a near copy
    of the model drafting (its guesses right at times, a different number kept in each row
    and pass): the cache rolls back to the fewest slots kept and each row feeds again what
    it kept past them. Every row's tokens are its plain greedy tokens alone."""
    model = _model(rung)
    prompts = [PROMPT, PROMPT[3:7], PROMPT[:2]]
    alone = [_plain_greedy(_model(), p) for p in prompts]
    draft = ModelDraft(_model(rung, noise=0.05))
    counts = Counts()
    engine = Engine(model, max_batch=3, counts=counts)
    seqs = engine.generate([Request(p, NEW, draft=draft, draft_tokens=3) for p in prompts])
    assert [s.generated for s in seqs] == alone
    assert 0 < counts.accepted < counts.drafted
    assert len(set(counts.kept)) > 2  # passes kept different numbers of guesses


def test_a_model_draft_guesses_what_its_model_would_say_after_any_context():
    """A draft's own cache follows the context it is given: after a guess that was not
    kept (the context goes another way), after a context cut back, after one that grows
    by several tokens. Each proposal is its model's greedy continuation of that context."""
    model = _model()
    draft = ModelDraft(model)
    contexts = [PROMPT, PROMPT + [3], PROMPT + [3, 44, 1], PROMPT[:6], PROMPT[:6] + [2, 2, 2]]
    for context in contexts:
        tokens, q = draft.propose(list(context), 4, row=0)
        assert tokens == _plain_greedy(model, context, 4), context
        assert q.shape == (4, CONFIG.vocab_size) and (q.argmax(axis=1) == tokens).all()


@pytest.mark.parametrize("cache", ["level", "paged"])
def test_a_model_drafting_for_itself_keeps_every_guess(cache):
    """The model as its own draft is always right: every guess kept, ``k + 1`` tokens a pass,
    over the level's cache and a paged one (blocks of 4: runs that cross blocks)."""
    model = _model()
    options = {"blocks": 40, "block_size": 4} if cache == "paged" else {}
    engine = Engine(model, cache=cache, max_batch=2, **options)
    requests = [Request(PROMPT, NEW, draft=ModelDraft(model), draft_tokens=3),
                Request(PROMPT[2:8], NEW, draft=ModelDraft(model), draft_tokens=3)]  # fmt: skip
    seqs = engine.generate(requests)
    assert [s.generated for s in seqs] == [_plain_greedy(model, r.ids) for r in requests]
    assert engine.counts.accepted == engine.counts.drafted > 0


def test_paged_sequences_that_keep_different_guesses_decode_as_alone():
    """Over a paged cache (blocks of 4: guesses that cross blocks), three sequences drafted
    for by a near copy of the model: each keeps its own number of guesses a pass, its count
    set back past the ones it did not keep and their blocks given back. Each text is its
    greedy text alone."""
    model = _model()
    prompts = [PROMPT, PROMPT[3:7], PROMPT[:2]]
    engine = Engine(model, cache="paged", max_batch=3, blocks=30, block_size=4)
    draft = ModelDraft(_model(noise=0.05))
    seqs = engine.generate([Request(p, NEW, draft=draft, draft_tokens=3) for p in prompts])
    assert [s.generated for s in seqs] == [_plain_greedy(model, p) for p in prompts]
    assert 0 < engine.counts.accepted < engine.counts.drafted
    assert engine.pool.available == engine.pool.blocks and not any(engine.pool.refs)


def test_a_preempted_sequence_resumes_at_its_own_positions():
    """A pool of twelve blocks of four for three sequences that need more: the newest is
    preempted while decoding, comes back, finds its own blocks by prefix, computes the rest
    of what it had and goes on. Each text is its greedy text alone, and every block and
    reference is back at the end."""
    model = _model()
    engine = Engine(model, cache="paged", max_batch=3, blocks=12, block_size=4)
    prompts = [PROMPT, PROMPT[::-1], PROMPT[2:9]]
    seqs = [engine.add(Request(p, 10)) for p in prompts]
    trace = []
    while any(s.finish is None for s in seqs):
        engine.step()
        trace += engine.said
    assert "r2 preempted" in trace and "r2 joins (14 tokens, 8 found cached)" in trace
    assert [s.generated for s in seqs] == [_plain_greedy(model, p, 10) for p in prompts]
    assert engine.pool.available == engine.pool.blocks and not any(engine.pool.refs)


def test_a_speculating_sampled_sequence_is_the_same_in_any_batch():
    """Seeded, sampled, speculating with another model, over a paged cache: a sequence's
    tokens are the same alone and among others (its draws, and its draft's, are its own)."""
    model = _model()

    def run(prompts):
        draft = ModelDraft(_model(noise=0.05))
        requests = [Request(p, NEW, Sampling(0.8, seed=7 + i), draft=draft)
                    for i, p in enumerate(prompts)]  # fmt: skip
        return [s.generated for s in Engine(model, cache="paged", max_batch=3).generate(requests)]

    together = run([PROMPT, PROMPT[1:6], PROMPT[4:]])
    assert together[0] == run([PROMPT])[0]


def test_block_references_are_counted_as_each_holder_lets_go():
    """Three tables share a published prefix of two blocks; as each lets go, the shared
    blocks stay held (never free, never idle) until the last holder has gone, and the
    blocks each held alone come back at once."""
    storage = PagedKVCache.storage(CONFIG, 12, 4, dtype=torch.float64)
    pool = BlockPool(*storage, 12, 4)
    tokens = list(range(1, 10))  # two full blocks and one token more
    first = pool.match(tokens[:-1])
    pool.reserve([first], len(tokens))
    first.count = len(tokens)
    pool.publish(first, tokens)
    holders = [first] + [pool.match(tokens + [20 + i]) for i in range(2)]
    shared = first.table[:2]
    for h in holders[1:]:
        assert h.table == shared and h.count == 8
        pool.reserve([h], 2)
    for left, h in enumerate(holders):
        pool.free(h)
        still = len(holders) - left - 1
        assert [pool.refs[b] for b in shared] == [still] * 2
        assert all((b in pool.idle) == (still == 0) and b not in pool.free_blocks for b in shared)
    assert pool.available == pool.blocks and not any(pool.refs)
    assert pool.match(tokens).count == 8  # idle, the prefix is still found


def test_the_compiled_step_run_eagerly_is_the_decode_step():
    """Level 3's compiled step (``compiled.DecodeStep`` over a ``SlotCache``: the model's own
    pass writing its keys at the slots it is given) run eagerly, uncompiled, against the
    model's decode step through its own cache: each step's logits equal, after a ragged
    prompt, over steps that cross nothing special; a wrong slot or position would move
    them."""
    from levels.level3_sdpa_flash import compiled

    model = _model("level3_sdpa_flash")
    prompts = torch.tensor([PROMPT, PROMPT[:6] + [0] * 4])
    valid = torch.tensor([[True] * 10, [True] * 6 + [False] * 4])
    run = compiled.DecodeStep(model)
    step = compiled.CompiledDecode(model, 2, run, report=None)
    with torch.no_grad():
        _, want_cache = model.prefill(prompts, valid=valid)
        _, got_cache = model.prefill(prompts, valid=valid)
        tokens = torch.tensor([3, 4])
        for _ in range(6):
            want = model.decode_step(tokens, want_cache)
            positions = torch.tensor(got_cache.next_positions())[:, None]
            with compiled._bare_attention(model):
                got = step(tokens[:, None], positions, got_cache)[:, -1]
            torch.testing.assert_close(got, want, rtol=0, atol=1e-12)  # float64, one order
            tokens = want.argmax(dim=-1)
        assert torch.equal(got_cache.positions, want_cache.positions)


def test_the_ngram_draft_in_a_batch_gives_each_row_its_plain_tokens():
    """The n-gram draft on prompts that repeat themselves, over a fixed batch: its guesses
    right at times and wrong at others, each row's tokens its plain greedy ones."""
    model = _model()
    prompts = [PROMPT + PROMPT[:5], PROMPT[4:] + PROMPT[4:8]]
    counts = Counts()
    seqs = Engine(model, max_batch=2, counts=counts).generate(
        [Request(p, NEW, draft=NGramDraft(max_n=3), draft_tokens=3) for p in prompts]
    )
    assert [s.generated for s in seqs] == [_plain_greedy(model, p) for p in prompts]
    assert counts.drafted > 0


# ----------------------------------------------------------------------------- pacing the guesses


def test_paced_guesses_make_the_most_tokens_a_second():
    """``paced_guesses`` by hand: a draft always right over passes that cost what a step costs
    guesses all it may; one never right guesses nothing; a pass that costs twice a step pays
    for two guesses at acceptance 1 (3 tokens in 2 steps), not at acceptance 0.5 (1.75 in 2):
    the tie at acceptance 0.5 and one guess (1.5 tokens in 1.5 steps against 1 in 1) goes to
    the fewest guesses; other rows take one token whatever the draft does."""
    from levels.common.speculative import paced_guesses

    flat = lambda k: 1.0  # noqa: E731  (a check as cheap as a step)
    assert paced_guesses([1.0], 0, 4, flat, 0.0) == 4
    assert paced_guesses([0.0], 0, 4, flat, 0.0) == 0
    double = lambda k: 1.0 if k == 0 else 2.0  # noqa: E731
    assert paced_guesses([1.0], 0, 2, double, 0.0) == 2
    assert paced_guesses([0.5], 0, 2, double, 0.0) == 0
    linear = lambda k: 1.0 + 0.5 * k  # noqa: E731
    assert paced_guesses([0.5], 0, 1, linear, 0.0) == 0  # 1.5 / 1.5 == 1 / 1: the tie
    assert paced_guesses([1.0], 0, 4, flat, 1.0) == 0  # a guess as dear as a step: never pays
    assert paced_guesses([1.0], 7, 4, double, 0.0) == 0  # 8 + 4 in 2 steps < 8 in 1


class _Clock:
    """The engine's clock (``time.perf_counter``), moved only by ``_Costly``'s passes."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Costly:
    """A model whose pass of ``T`` positions a row costs ``5 + 1.5 T`` ms on ``clock``: a fixed
    part (the weights read once) and a part a position, as on a machine where a check of
    guesses is neither free nor as dear as its steps; guesses cost nothing."""

    def __init__(self, model, clock: _Clock):
        self.model, self.clock = model, clock
        self.config, self.arrays, self.device = model.config, model.arrays, model.device
        self.new_cache = model.new_cache

    def transformer(self, ids, positions, cache=None, last=False):
        self.clock.now += 0.005 + 0.0015 * ids.shape[1]
        return self.model.transformer(ids, positions, cache, last)


@pytest.mark.parametrize("right", [False, True], ids=["always wrong", "always right"])
def test_paced_guessing_stops_where_it_does_not_pay_and_goes_on_where_it_does(right, monkeypatch):
    """Paced (``draft_tokens=None``) over a model whose check of ``k`` guesses costs
    ``(6.5 + 1.5 k) / 6.5`` steps on the engine's clock; either way the tokens are plain
    greedy decoding's. A draft never right: the first two passes guess ``PACED`` (a width not
    timed is taken as cheap as a step; a shape's first pass is not counted), the third one
    (acceptance 1/4 by the prior of one kept in two: 1.25 tokens in 8 ms beat 1 in 6.5), and
    then none (1/5: 1.2 in 8 ms lose) but a probe of ``PACED`` after every ``PROBE`` plain
    passes. One always right (the model itself) guesses ``PACED`` on every pass once the
    widths are timed."""
    import engine.engine
    from levels.common.speculative import PACED, PROBE

    clock = _Clock()
    monkeypatch.setattr(engine.engine.time, "perf_counter", clock)
    model = _model("level1_numpy")
    want = _greedy(model, PROMPT, 40)
    never = next(t for t in range(CONFIG.vocab_size) if t not in want)
    draft = ModelDraft(model) if right else _Fixed(never)
    seq = Engine(_Costly(model, clock)).generate(
        [Request(PROMPT, 40, draft=draft, draft_tokens=None)]
    )[0]
    assert seq.generated == want
    if right:
        assert seq.counts.accepted == seq.counts.drafted
        assert seq.counts.guessed[3:-2] == [PACED] * (len(seq.counts.guessed) - 5)
    else:
        assert seq.counts.accepted == 0 and seq.counts.guessed[:3] == [PACED, PACED, 1]
        probes = seq.counts.guessed[3:]
        assert probes == [PACED] * len(probes) and 1 <= len(probes) <= seq.counts.passes // PROBE


def test_a_check_timed_cheaper_than_a_step_is_taken_as_a_step():
    """Noise can time a wider pass below a step; a guess never kept must still not pay."""
    from levels.common.speculative import Pace

    pace = Pace()
    for width, seconds in ((1, 0.010), (1, 0.010), (2, 0.004), (2, 0.004)):
        pace.passed(1, width, seconds)  # each shape's first pass is not counted
    assert pace.guesses([0.0], 0, lambda k: k + 1) == 0
    assert pace.guesses([1.0], 0, lambda k: k + 1) > 0


class _Fixed:
    """A draft that always guesses the same token (one-hot): never right, if the token is
    one greedy decoding never writes."""

    def __init__(self, token: int):
        self.token = token

    def propose(self, context, k, row=0, sampling=None):
        return [self.token] * k, None
