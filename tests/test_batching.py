"""Token-budget batching: budget respected, epochs complete, reproducible, resumable, shardable."""

import numpy as np
import pytest
import torch

from nmt.data import Batch, EncodedSplit, TokenBatchSampler, collate, drop_words
from nmt.errors import NMTError
from nmt.text.special import BOS_ID, EOS_ID, PAD_ID, UNK_ID

MAX_TOKENS = 300


@pytest.fixture(scope="module")
def lengths() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    src = rng.integers(1, 40, size=2000)
    return src, np.clip(src + rng.integers(-5, 6, size=2000), 1, None)


def sampler(lengths, **kwargs) -> TokenBatchSampler:
    return TokenBatchSampler(*lengths, MAX_TOKENS, seed=kwargs.pop("seed", 3), **kwargs)


def epoch(s: TokenBatchSampler) -> list[list[int]]:
    return list(s)


def cost(batch: list[int], src: np.ndarray, tgt: np.ndarray) -> int:
    return len(batch) * (src[batch].max() + 1 + tgt[batch].max() + 1)


def test_batches_fit_the_budget_and_cover_the_epoch_once(lengths):
    batches = epoch(sampler(lengths))
    assert max(cost(b, *lengths) for b in batches) <= MAX_TOKENS
    assert sorted(i for b in batches for i in b) == list(range(len(lengths[0])))
    assert np.mean([cost(b, *lengths) for b in batches]) > 0.8 * MAX_TOKENS  # batches are full


def test_batches_group_similar_lengths(lengths):
    spread = [np.ptp(lengths[0][b]) for b in epoch(sampler(lengths))]
    assert np.mean(spread) <= 1


def test_same_seed_same_order_other_epochs_and_seeds_differ(lengths):
    first = epoch(sampler(lengths))
    assert epoch(sampler(lengths)) == first
    assert epoch(sampler(lengths, seed=4)) != first
    s = sampler(lengths)
    s.set_epoch(1)
    assert epoch(s) != first


def test_iterating_past_the_end_moves_to_the_next_epoch(lengths):
    s = sampler(lengths)
    epoch(s)
    assert s.state_dict() == {"epoch": 1, "position": 0}
    reference = sampler(lengths)
    reference.set_epoch(1)
    assert epoch(s) == epoch(reference)


def test_restoring_mid_epoch_yields_exactly_the_remaining_batches(lengths):
    s = sampler(lengths)
    s.set_epoch(2)
    reference = sampler(lengths)
    reference.set_epoch(2)
    full = epoch(reference)
    iterator = iter(s)
    consumed = [next(iterator) for _ in range(7)]
    state = s.state_dict()
    assert state == {"epoch": 2, "position": 7} and consumed == full[:7]

    restored = sampler(lengths)
    restored.load_state_dict(state)
    restored.set_epoch(2)  # a trainer may call this again for the current epoch: keeps the position
    assert epoch(restored) == full[7:]
    assert len(restored) == len(full)


def test_shards_are_disjoint_and_equally_long(lengths):
    world = 3
    all_batches = epoch(sampler(lengths))
    shards = [epoch(sampler(lengths, rank=r, world_size=world)) for r in range(world)]
    assert len({len(shard) for shard in shards}) == 1
    assert len(shards[0]) == len(all_batches) // world
    seen = [i for shard in shards for b in shard for i in b]
    assert len(seen) == len(set(seen))
    dropped = len(all_batches) - world * len(shards[0])
    assert 0 <= dropped < world
    assert sorted(b for shard in shards for b in shard) == sorted(all_batches[: len(all_batches) - dropped])


def test_shard_r_gets_every_world_size_th_batch(lengths):
    all_batches = epoch(sampler(lengths))
    shard = epoch(sampler(lengths, rank=1, world_size=2))
    assert shard == all_batches[1 : len(all_batches) // 2 * 2 : 2]


def test_each_epoch_is_batched_by_its_own_segmentation(lengths):
    """Subword sampling: row e % rows of the lengths is the corpus as epoch e will see it."""
    longer = (lengths[0] * 2, lengths[1] * 2)
    s = TokenBatchSampler(np.stack([lengths[0], longer[0]]), np.stack([lengths[1], longer[1]]), MAX_TOKENS)
    for rows in (lengths, longer, lengths):
        batches = epoch(s)
        assert max(cost(b, *rows) for b in batches) <= MAX_TOKENS
        assert np.mean([cost(b, *rows) for b in batches]) > 0.8 * MAX_TOKENS


def test_example_longer_than_the_budget_is_a_batch_of_its_own():
    s = TokenBatchSampler([3, 500, 4], [3, 2, 4], 100, shuffle=False)
    assert sorted(epoch(s)) == [[0, 2], [1]]


def test_without_shuffle_batches_follow_length_order():
    s = TokenBatchSampler([5, 1, 3, 1], [1, 1, 1, 2], 10, shuffle=False)
    assert epoch(s) == [[1, 3], [2], [0]]


# ------------------------------------------------------------------------------------------ collate


def encoded(src: list[list[int]], tgt: list[list[int]]) -> EncodedSplit:
    def flat(seqs):
        return np.array([i for s in seqs for i in s], dtype=np.int32), np.cumsum([0, *map(len, seqs)])

    return EncodedSplit(*flat(src), *flat(tgt))


def test_collate_adds_specials_and_pads():
    split = encoded([[10, 11, 12], [13]], [[20], [21, 22]])
    batch = collate(split, [1, 0], max_positions=100)
    assert isinstance(batch, Batch) and len(batch) == 2
    assert batch.src.tolist() == [[13, EOS_ID, PAD_ID, PAD_ID], [10, 11, 12, EOS_ID]]
    assert batch.tgt_in.tolist() == [[BOS_ID, 21, 22], [BOS_ID, 20, PAD_ID]]
    assert batch.tgt_out.tolist() == [[21, 22, EOS_ID], [20, EOS_ID, PAD_ID]]
    assert batch.src.dtype == batch.tgt_in.dtype == torch.long
    assert (batch.src_tokens, batch.tgt_tokens) == (6, 5)
    assert batch.padding_fraction == pytest.approx(3 / 14)


def test_collate_truncates_to_max_positions():
    split = encoded([list(range(10, 30))], [list(range(40, 50))])
    batch = collate(split, [0], max_positions=8)
    assert batch.src.tolist() == [[10, 11, 12, 13, 14, 15, 16, EOS_ID]]
    assert batch.tgt_in.tolist() == [[BOS_ID, 40, 41, 42, 43, 44, 45, 46]]
    assert batch.tgt_out.tolist() == [[40, 41, 42, 43, 44, 45, 46, EOS_ID]]


def test_batch_to_moves_every_tensor():
    batch = collate(encoded([[5]], [[6]]), [0], max_positions=10).to("meta")
    assert {t.device.type for t in (batch.src, batch.tgt_in, batch.tgt_out)} == {"meta"}


def test_word_dropout_replaces_input_words_by_unk_at_the_rate_asked():
    rng = np.random.default_rng(0)
    seqs = [rng.integers(10, 50, size=rng.integers(5, 30)).tolist() for _ in range(200)]
    batch = collate(encoded(seqs, seqs), list(range(200)), max_positions=100)
    torch.manual_seed(0)
    dropped = drop_words(batch, 0.3, 0.1)
    assert torch.equal(dropped.tgt_out, batch.tgt_out)  # what is predicted never changes
    for before, after, p in ((batch.src, dropped.src, 0.3), (batch.tgt_in, dropped.tgt_in, 0.1)):
        words = (before != PAD_ID) & (before != BOS_ID) & (before != EOS_ID)
        changed = before != after
        assert not (changed & ~words).any()  # padding, BOS and EOS stay
        assert (after[changed] == UNK_ID).all()
        assert changed.sum() / words.sum() == pytest.approx(p, abs=0.03)
    off = drop_words(batch, 0.0, 0.0)
    assert off.src is batch.src and off.tgt_in is batch.tgt_in  # off: the very same tensors


def test_more_processes_than_batches_is_refused_not_an_endless_epoch():
    sampler = TokenBatchSampler(np.array([3, 3]), np.array([3, 3]), max_tokens=100, rank=1, world_size=2)
    with pytest.raises(NMTError, match="1 batch.*fewer than the 2 processes.*trainer.max_tokens"):
        next(iter(sampler))
