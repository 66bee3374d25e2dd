"""ShardLocalSampler: the exact draw of every balance strategy in a shard-local order; the ranks'
shares; resume; and what the order saves in downloads (downloaded_bytes, an LRU simulation)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from balance_helpers import long_tail_index
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

from detloader.balance import (
    BalancedBatchSampler,
    ClassAwareSampler,
    RepeatFactorSampler,
    WeightedSampler,
    make_balanced_sampler,
)
from detloader.balance.shard_order import ShardLocalSampler, downloaded_bytes
from detloader.errors import DetloaderValueError, DetloaderWarning
from detloader.resume import ResumableLoader

#: Every kind of balance= make_loader takes: strategy names, a {group: weight} mapping.
BALANCES = ["inverse", "sqrt", "power:0.3", "effective", "repeat_factor:0.05", "class_aware", {"c0000": 0.2}]


def _pack(n: int, per_shard: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(shard_of, shard_bytes)`` of a pack of ``n`` images in shards of ``per_shard``
    consecutive rows, each image 20-400 KB (log-normal)."""
    image_bytes = np.random.default_rng(seed).lognormal(np.log(100_000), 0.5, n).clip(20_000, 400_000).astype(np.int64)
    shard_of = np.arange(n) // per_shard
    return shard_of, np.bincount(shard_of, weights=image_bytes).astype(np.int64)


@pytest.fixture(scope="module")
def index():
    return long_tail_index(400, 60, seed=3)


def _wrapped(inner, shard_of, shard_bytes, cache, epoch, **kwargs) -> np.ndarray:
    s = ShardLocalSampler(inner, shard_of, shard_bytes, cache, **kwargs)
    s.set_epoch(epoch)
    return s.indices()


# -- downloaded_bytes ---------------------------------------------------------------------------
def test_downloaded_bytes_evicts_least_recently_used():
    assert downloaded_bytes([0, 1, 0, 2, 1], [3, 3, 3], 6) == 12  # 2 evicts 1, then 1 evicts 0
    assert downloaded_bytes([0, 1, 0, 2, 0], [3, 3, 3], 6) == 9  # 2 evicts 1; 0 stays
    assert downloaded_bytes([0, 0, 1, 0], [10, 2], 5) == 22  # 10 > 5: held while read, then evicted
    assert downloaded_bytes([], [1], 1) == 0
    with pytest.raises(DetloaderValueError, match="shard 3, outside"):
        downloaded_bytes([0, 3], [1, 1], 4)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 7), max_size=60), st.lists(st.integers(1, 9), min_size=8, max_size=8),
       st.integers(1, 80))
def test_downloaded_bytes_bounds(reads, sizes, cache):
    """Every shard read is downloaded at least once; a cache that holds them all downloads
    each exactly once; a smaller cache never downloads less."""
    distinct = sum(sizes[s] for s in set(reads))
    got = downloaded_bytes(reads, sizes, cache)
    assert got >= distinct
    assert downloaded_bytes(reads, sizes, max(sum(sizes), 1)) == distinct
    assert got >= downloaded_bytes(reads, sizes, cache + sum(sizes))


# -- the exact draw -----------------------------------------------------------------------------
@pytest.mark.parametrize("balance", BALANCES, ids=str)
def test_multiset_of_every_balance_strategy(index, balance):
    shard_of, shard_bytes = _pack(len(index), 8)
    make = lambda: make_balanced_sampler(index, balance, seed=11, rank=0, world_size=1)  # as make_loader  # noqa: E731
    for epoch in (0, 3):
        alone = make()
        alone.set_epoch(epoch)
        expected = alone.indices()
        got = _wrapped(make(), shard_of, shard_bytes, int(shard_bytes.sum()) // 4, epoch, seed=11)
        assert sorted(got.tolist()) == sorted(expected.tolist())
        assert got.tolist() != expected.tolist()  # reordered


@pytest.mark.parametrize("make", [
    lambda n: RandomSampler(range(n), generator=torch.Generator().manual_seed(4)),  # shuffle=True
    lambda n: WeightedSampler(np.ones(n), replacement=False, seed=4),  # shuffle=True with mosaic/mixup
], ids=["RandomSampler", "uniform-no-replacement"])
def test_shuffle_draws_every_index_once(make):
    n = 300
    shard_of, shard_bytes = _pack(n, 16)
    for epoch in (0, 1):
        got = _wrapped(make(n), shard_of, shard_bytes, int(shard_bytes.sum()) // 4, epoch)
        assert sorted(got.tolist()) == list(range(n))


def test_seed_and_epoch_fix_the_order(index):
    shard_of, shard_bytes = _pack(len(index), 8)
    cache = int(shard_bytes.sum()) // 4
    sqrt = lambda: make_balanced_sampler(index, "sqrt", seed=1, rank=0, world_size=1)  # noqa: E731
    a, b = (_wrapped(sqrt(), shard_of, shard_bytes, cache, 2, seed=7) for _ in range(2))
    assert np.array_equal(a, b)
    other_epoch = _wrapped(sqrt(), shard_of, shard_bytes, cache, 3, seed=7)
    other_seed = _wrapped(sqrt(), shard_of, shard_bytes, cache, 2, seed=8)
    assert not np.array_equal(a, other_seed) and sorted(a.tolist()) == sorted(other_seed.tolist())
    assert sorted(a.tolist()) != sorted(other_epoch.tolist())  # another epoch, another draw


@pytest.mark.filterwarnings("ignore:ShardLocalSampler.*larger than cache_bytes")  # small caches on purpose
@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 120), per_shard=st.integers(1, 20), cache=st.integers(1, 3_000_000),
       seed=st.integers(0, 2**20), epoch=st.integers(0, 5))
def test_windows_hold_each_drawn_shard_once(n, per_shard, cache, seed, epoch):
    """Along the global order the windows ascend; each shard lies in one window; a window of
    two or more shards holds at most half the cache; the order is the inner draw's multiset."""
    shard_of, shard_bytes = _pack(n, per_shard, seed % 7)
    inner = WeightedSampler(np.linspace(1, 9, n), seed=seed)
    s = ShardLocalSampler(inner, shard_of, shard_bytes, cache, seed=seed)
    s.set_epoch(epoch)
    items, ranks, windows = s.global_order()
    assert (np.diff(windows) >= 0).all() and (ranks == 0).all()
    shards = shard_of[items]
    for k in np.unique(windows):
        held = np.unique(shards[windows == k])
        assert len(held) == 1 or shard_bytes[held].sum() <= cache // 2
    assert all(len(np.unique(windows[shards == sh])) == 1 for sh in np.unique(shards))
    inner.set_epoch(epoch)
    assert sorted(items.tolist()) == sorted(inner.indices().tolist())


# -- ranks --------------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 150), world=st.integers(1, 4), drop_last=st.booleans(), seed=st.integers(0, 1000),
       kind=st.sampled_from(["weighted", "repeat_factor", "class_aware", "no_replacement"]),
       inner_world=st.sampled_from(["same", "one"]))
def test_rank_shares_partition_the_padded_draw(n, world, drop_last, seed, kind, inner_world):
    """Equal lengths; the shares are the global order's positions of each rank; their union is
    the multiset of the inner sampler's own rank shares (padded as make_loader pads)."""
    shard_of, shard_bytes = _pack(n, 7)
    weights = np.linspace(0.5, 3, n)
    members = [range(0, max(1, n // 2)), range(n // 2, n)] if n > 1 else [range(1)]

    def make(rank, w):
        common = {"seed": seed, "rank": rank, "world_size": w, "drop_last": drop_last}
        if kind == "weighted":
            return WeightedSampler(weights, **common)
        if kind == "no_replacement":
            return WeightedSampler(weights, replacement=False, **common)
        if kind == "repeat_factor":
            return RepeatFactorSampler(weights, **common)
        return ClassAwareSampler(members, **common)

    if drop_last and n < world:
        return  # nothing to share: every rank's share is empty
    inner_w = world if inner_world == "same" else 1
    shares = []
    for r in range(world):
        s = ShardLocalSampler(make(0, inner_w), shard_of, shard_bytes, 10**8, seed=seed, rank=r,
                              world_size=world, drop_last=drop_last)
        s.set_epoch(1)
        shares.append(s.indices())
        items, ranks, _ = s.global_order()
        assert np.array_equal(shares[r], items[ranks == r])  # positions of the one global order: disjoint
    assert len({len(p) for p in shares}) == 1
    union = np.concatenate(shares)
    if inner_world == "same":  # what make_loader gives each rank today
        today = []
        for r in range(world):
            inner = make(r, world)
            inner.set_epoch(1)
            today.append(inner.indices())
        assert sorted(union.tolist()) == sorted(np.concatenate(today).tolist())
    else:
        alone = make(0, 1)
        alone.set_epoch(1)
        draw = alone.indices()
        size = len(draw) // world * world if drop_last else -(-len(draw) // world) * world
        assert sorted(union.tolist()) == sorted(np.resize(draw, size).tolist())


# -- downloads ----------------------------------------------------------------------------------
def test_one_epoch_downloads_the_pack_about_once(capsys):
    """balance='sqrt' over a long-tail index in 200 shards, cache a quarter of the pack: the
    shard-local order downloads at most 1.5x the pack; a random order of the same draw more."""
    index = long_tail_index(2000, 300, seed=5)
    shard_of, shard_bytes = _pack(len(index), 10)
    assert len(shard_bytes) == 200
    pack, cache = int(shard_bytes.sum()), int(shard_bytes.sum()) // 4
    inner = make_balanced_sampler(index, "sqrt", seed=2, rank=0, world_size=1)
    local = _wrapped(inner, shard_of, shard_bytes, cache, 0, seed=2)
    inner.set_epoch(0)
    random_order = inner.indices()
    assert sorted(local.tolist()) == sorted(random_order.tolist())
    ours, theirs = (downloaded_bytes(shard_of[o], shard_bytes, cache) for o in (local, random_order))
    # ranks of 4 nodes, each with its own cache of a quarter of the pack
    ranks = [ShardLocalSampler(inner, shard_of, shard_bytes, cache, seed=2, rank=r, world_size=4) for r in range(4)]
    for r in ranks:
        r.set_epoch(0)
    items, _, _ = ranks[0].global_order()
    blocks = sum(downloaded_bytes(shard_of[r.indices()], shard_bytes, cache) for r in ranks)
    interleaved = sum(downloaded_bytes(shard_of[items[r::4]], shard_bytes, cache) for r in range(4))
    with capsys.disabled():
        print(f"\npack {pack / 1e6:.1f} MB, cache {cache / 1e6:.1f} MB, sqrt epoch of {len(local)} images: "
              f"shard-local {ours / pack:.2f}x the pack, random order {theirs / pack:.2f}x; "
              f"4 ranks: blocks {blocks / pack:.2f}x, interleaved {interleaved / pack:.2f}x")
    assert ours <= 1.5 * pack
    assert theirs > 2 * ours
    assert blocks <= 1.5 * pack < interleaved


# -- resume -------------------------------------------------------------------------------------
def test_state_dict_resumes_mid_epoch(index):
    shard_of, shard_bytes = _pack(len(index), 8)

    def make(**kwargs):
        inner = make_balanced_sampler(index, "repeat_factor:0.05", seed=3, rank=0, world_size=1)
        return ShardLocalSampler(inner, shard_of, shard_bytes, 2_000_000, seed=3, rank=1, world_size=2, **kwargs)

    first = make()
    first.set_epoch(4)
    whole = first.indices().tolist()
    it = iter(first)
    head = [next(it) for _ in range(37)]
    state = first.state_dict()
    assert state["offset"] == 37 and state["kind"] == "ShardLocalSampler"
    second = make()
    second.load_state_dict(state)
    second.set_epoch(4)  # the same epoch keeps the offset
    assert head + list(second) == whole
    with pytest.raises(DetloaderValueError, match="cache_bytes"):
        ShardLocalSampler(first.sampler, shard_of, shard_bytes, 3_000_000, seed=3, rank=1,
                          world_size=2).load_state_dict(state)


def test_resumable_loader_with_another_number_of_workers(index):
    """Interrupted with 2 workers (which prefetch), resumed with none: the rest of the epoch."""
    shard_of, shard_bytes = _pack(len(index), 8)
    data = TensorDataset(torch.arange(len(index)))

    def loader(workers):
        inner = make_balanced_sampler(index, "sqrt", seed=9, rank=0, world_size=1)
        s = ShardLocalSampler(inner, shard_of, shard_bytes, 2_000_000, seed=9)
        return ResumableLoader(DataLoader(data, batch_size=16, sampler=s, num_workers=workers))

    def ids(batches):
        return [i for b in batches for i in b[0].tolist()]

    full = loader(0)
    full.set_epoch(2)
    expected = ids(full)
    cut = loader(2)
    cut.set_epoch(2)
    head = []
    for k, batch in enumerate(cut):
        head.append(batch)
        if k == 4:
            break
    state = cut.state_dict()
    rest = loader(0)
    rest.load_state_dict(state)
    rest.set_epoch(2)
    assert ids(head) + ids(rest) == expected


# -- refusals -----------------------------------------------------------------------------------
def test_refusals_name_the_value():
    shard_of, shard_bytes = _pack(20, 5)
    inner = WeightedSampler(np.ones(20), seed=0)
    with pytest.raises(DetloaderValueError, match=r"shard_of\[3\]=9"):
        ShardLocalSampler(inner, np.array([0, 1, 2, 9]), shard_bytes, 100)
    with pytest.raises(DetloaderValueError, match="cache_bytes=0"):
        ShardLocalSampler(inner, shard_of, shard_bytes, 0)
    with pytest.raises(DetloaderValueError, match="world_size=3"):
        ShardLocalSampler(WeightedSampler(np.ones(20), rank=0, world_size=3), shard_of, shard_bytes, 100,
                          rank=0, world_size=2)
    short = ShardLocalSampler(inner, shard_of[:10], shard_bytes, 10**7)
    with pytest.raises(DetloaderValueError, match="shard_of maps 10 indices"):
        short.indices()
    batches = ShardLocalSampler(BalancedBatchSampler([range(10), range(10, 20)], 2, 2), shard_of, shard_bytes, 10**7)
    with pytest.raises(DetloaderValueError, match="batches or groups"):
        batches.indices()
    with pytest.warns(DetloaderWarning, match="4 of 4 shards are larger than cache_bytes=1000"):
        ShardLocalSampler(inner, shard_of, shard_bytes, 1000)
