"""The generated toy tasks: seeded, well-formed, held-out drawn independently,
and a majority baseline computed as its definition says."""

from __future__ import annotations

import pytest

from levels.common.tasks import (
    BOS_ID,
    EOS_ID,
    FIRST_SYMBOL,
    CycleTask,
    DecoderOnlyExample,
    Seq2SeqExample,
    Seq2SeqTask,
    majority_baseline,
    make_task,
)


@pytest.mark.parametrize("name", ["copy", "reverse"])
def test_seq2seq_examples_are_well_formed(name):
    task = Seq2SeqTask(name=name, vocab_size=11, min_len=2, max_len=9)
    examples = task.sample(300, seed=5, split="train")
    lengths = set()
    for e in examples:
        x = list(e.src[1:-1])
        assert e.src[0] == BOS_ID and e.src[-1] == EOS_ID
        assert all(FIRST_SYMBOL <= t < 11 for t in x)
        want = x if name == "copy" else x[::-1]
        assert list(e.tgt) == [BOS_ID, *want, EOS_ID]
        assert e.scored == e.tgt[1:]
        lengths.add(len(x))
    # Every length of the range occurs in 300 draws (a missing one has
    # probability below 8 * (7/8)^300).
    assert lengths == set(range(2, 10))
    assert (
        max(len(e.tgt) for e in examples) == max(len(e.src) for e in examples) == task.max_seq_len
    )


def _period_from_prompt(prompt: tuple[int, ...]) -> int:
    """The period, read from the prompt as a person would: where the first symbol recurs."""
    body = prompt[1:]
    return body.index(body[0], 1)


def test_cycle_examples_continue_their_prompt():
    task = CycleTask(vocab_size=12, min_period=2, max_period=5, min_continuation=3)
    examples = task.sample(300, seed=1, split="train")
    periods = set()
    for e in examples:
        assert e.tokens[0] == BOS_ID
        p = _period_from_prompt(e.tokens[: e.prompt_len])
        periods.add(p)
        pattern = e.tokens[1 : 1 + p]
        assert len(set(pattern)) == p, "a pattern repeats a symbol"
        assert e.prompt_len == p + 2
        # Everything after BOS is the pattern repeated.
        assert all(t == pattern[i % p] for i, t in enumerate(e.tokens[1:]))
        assert task.min_continuation <= len(e.scored) <= task.max_continuation
        assert len(e.tokens) <= task.max_seq_len
    assert periods == {2, 3, 4, 5}


@pytest.mark.parametrize("kind,name", [("seq2seq", "copy"), ("decoder_only", None)])
def test_sampling_is_seeded_and_splits_are_independent(kind, name):
    task = make_task(kind, name)
    a = task.sample(50, seed=3, split="train")
    assert a == task.sample(50, seed=3, split="train")
    assert a != task.sample(50, seed=4, split="train")
    heldout = task.sample(50, seed=3, split="heldout")
    # An independent stream, not the training stream shifted: the two share
    # no prefix, and most sequences differ (only very short ones can coincide).
    assert heldout[0] != a[0]
    assert sum(h != t for h, t in zip(heldout, a, strict=True)) >= 40


def test_majority_baseline_by_hand():
    train = [
        Seq2SeqExample(src=(3, EOS_ID), tgt=(BOS_ID, 3, EOS_ID)),
        Seq2SeqExample(src=(4, 3, EOS_ID), tgt=(BOS_ID, 4, 3, EOS_ID)),
    ]
    # Scored tokens: 3, EOS, 4, 3, EOS -> 3 and EOS tie at 2; the smaller id (EOS = 2) wins.
    heldout = [Seq2SeqExample(src=(5, 5, EOS_ID), tgt=(BOS_ID, 5, 5, EOS_ID))]
    token, accuracy = majority_baseline(train, heldout)
    assert token == EOS_ID
    assert accuracy == pytest.approx(1 / 3)  # one EOS among three scored tokens

    cyc = [DecoderOnlyExample(tokens=(BOS_ID, 3, 4, 3, 4, 3), prompt_len=4)]
    # Scored: the continuation (4, 3); a tie again, so token 3 (the smaller).
    assert majority_baseline(cyc, cyc) == (3, 0.5)


def test_bad_task_arguments():
    with pytest.raises(ValueError, match="seq2seq task"):
        Seq2SeqTask(name="sort")
    with pytest.raises(ValueError, match="min_len"):
        Seq2SeqTask(min_len=5, max_len=4)
    with pytest.raises(ValueError, match="max_period"):
        CycleTask(vocab_size=6, max_period=4)  # only 3 symbols: no 4 distinct ones
    with pytest.raises(ValueError, match="kind"):
        make_task("encoder_only")
    with pytest.raises(ValueError, match="split"):
        Seq2SeqTask().sample(1, 0, "test")
