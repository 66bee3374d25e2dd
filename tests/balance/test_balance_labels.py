"""detloader.balance.label_lists: balancing from per-image class arrays (what detloader.ultralytics
reads from an Ultralytics dataset), the self-advancing epoch and the rect refusal. No
ultralytics needed."""

from __future__ import annotations

import numpy as np
import pytest

from detloader.balance import AutoEpochSampler, WeightedSampler, labels_index, labels_sampler, sample_weights
from detloader.balance.label_lists import check_balance, check_label_key, check_rect_batches
from detloader.errors import DetloaderError, DetloaderTypeError, DetloaderValueError, RectBatchError
from tests.balance_helpers import tiny_index


def _long_tail(n: int = 40, rare_images: int = 2) -> list[np.ndarray]:
    """Ultralytics-shaped labels ((k, 1) float32): class 0 everywhere, class 1 in half, class 2
    (rare) in ``rare_images`` images, image 5 empty (a background image)."""
    out = []
    for i in range(n):
        ids = [0, 0] + ([1] if i % 2 else []) + ([2] if i < rare_images else [])
        out.append(np.array(ids if i != 5 else [], dtype=np.float32).reshape(-1, 1))
    return out


def test_labels_index_matches_a_read_index_weights():
    labels = [[0, 0, 0], [0, 1], [0], [1, 1], [], [2, 0]]
    ours = labels_index([np.array(x, dtype=np.float32).reshape(-1, 1) for x in labels], ("a", "b", "c"))
    assert len(ours) == 6 and ours.classes == ("a", "b", "c")
    assert ours.class_counts() == {"a": 6, "b": 3, "c": 1}
    for strategy in ("inverse", "sqrt", "effective"):
        np.testing.assert_allclose(sample_weights(ours, "class", strategy), sample_weights(tiny_index(labels), "class",
                                                                                           strategy))


def test_labels_index_names_ids_beyond_the_names_and_refuses_bad_ids():
    assert labels_index([[0], [3]], ("a",)).classes == ("a", "1", "2", "3")
    for bad in ([[0.5]], [[-1]], [[np.nan]]):
        with pytest.raises(DetloaderValueError, match="class id"):
            labels_index(bad, ("a",))
    with pytest.raises(DetloaderValueError, match="empty"):
        labels_index([], ("a",))


def test_inverse_gives_the_rare_class_at_least_three_times_its_raw_share():
    labels = _long_tail()
    raw = np.mean([2 in x for x in labels])
    sampler = labels_sampler(labels, ("common", "half", "rare"), "inverse", seed=3)
    drawn = list(sampler)
    assert len(drawn) == len(labels)
    share = np.mean([2 in labels[i] for i in drawn])
    assert share >= 3 * raw, (share, raw)


def test_each_iteration_is_a_new_epoch_and_the_same_seed_repeats_them():
    labels = _long_tail()
    a = labels_sampler(labels, (), "sqrt", seed=1)
    b = labels_sampler(labels, (), "sqrt", seed=1)
    epochs = [list(a) for _ in range(3)]
    assert epochs[0] != epochs[1] != epochs[2]
    assert a.epoch == 2 and a.next_epoch == 3
    assert [list(b) for _ in range(3)] == epochs
    # each iteration is the wrapped sampler's draw of that epoch
    inner = b.sampler
    inner.set_epoch(1)
    assert list(inner) == epochs[1]


def test_set_epoch_never_redraws_an_epoch_begun_early():
    s = labels_sampler(_long_tail(), (), "sqrt")
    first = list(s)  # epoch 0
    it = iter(s)
    next(it)  # a persistent worker starts epoch 1 before the loop says so
    s.set_epoch(1)  # the loop's late call: ignored
    rest = list(it)
    assert s.next_epoch == 2
    assert list(s) != first and s.epoch == 2
    s.set_epoch(7)  # a jump ahead (resume) is taken
    assert s.next_epoch == 7
    seven = list(s)
    assert list(labels_sampler(_long_tail(), (), "sqrt", start_epoch=7)) == seven
    assert len(rest) == len(first) - 1


def test_state_dict_restores_the_next_epoch():
    s = labels_sampler(_long_tail(), (), "inverse", seed=4)
    list(s), list(s)
    t = labels_sampler(_long_tail(), (), "inverse", seed=4)
    t.load_state_dict(s.state_dict())
    assert list(t) == list(s)
    with pytest.raises(DetloaderValueError, match="next_epoch"):
        t.load_state_dict({})


def test_ranks_share_one_global_draw_per_epoch():
    labels = _long_tail(41)
    ranks = [labels_sampler(labels, (), "sqrt", seed=2, rank=r, world_size=2) for r in range(2)]
    whole = labels_sampler(labels, (), "sqrt", seed=2, rank=0, world_size=1)
    for _ in range(2):
        parts = [list(r) for r in ranks]
        full = list(whole)
        assert len(parts[0]) == len(parts[1]) == 21  # padded by wrapping, as make_loader
        assert parts[0][:20] == full[0::2][:20] and parts[1][:20] == full[1::2][:20]


@pytest.mark.parametrize("balance", ["sqrt", "inverse", "power:0.3", "effective:0.99", "repeat_factor:0.5",
                                     "class_aware", {"rare": 5.0}])
def test_every_make_loader_strategy_is_accepted(balance):
    s = labels_sampler(_long_tail(), ("common", "half", "rare"), balance)
    assert len(list(s)) == len(s) > 0


def test_refusals_name_the_value():
    with pytest.raises(DetloaderValueError, match="'median'"):
        check_balance("median")
    with pytest.raises(DetloaderValueError, match="explicit"):
        check_balance("explicit")
    with pytest.raises(DetloaderTypeError, match="balance=3"):
        check_balance(3)
    with pytest.raises(DetloaderValueError, match="by='image_class'"):
        check_label_key("image_class")
    assert check_label_key("class") == "class"
    with pytest.raises(DetloaderTypeError, match="set_epoch"):
        AutoEpochSampler([1, 2, 3])


def test_rect_with_several_batch_shapes_is_refused_by_name():
    check_rect_batches(False, np.array([[320, 640], [640, 640]]))
    check_rect_batches(True, np.array([[640, 640], [640, 640]]))  # one shape: batches stack
    check_rect_batches(True, None)
    with pytest.raises(RectBatchError, match=r"rect=True .* 2 batch shapes \(320x640, 640x640\)") as err:
        check_rect_batches(True, np.array([[320, 640], [640, 640], [320, 640]]))
    assert isinstance(err.value, DetloaderError) and isinstance(err.value, ValueError)


def test_the_sampler_is_a_weighted_sampler_of_the_labels_weights():
    labels = _long_tail()
    s = labels_sampler(labels, (), "inverse")
    assert isinstance(s.sampler, WeightedSampler)
    np.testing.assert_allclose(s.sampler.weights, sample_weights(labels_index(labels, ()), "class", "inverse"))
