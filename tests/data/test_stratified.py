"""stratified_subset / stratified_split and load_data's limit_train / limit_eval."""

import random

import pytest
import torch

from gpattn_ppl.data import (
    DATASETS,
    RawData,
    load_data,
    register_dataset,
    stratified_split,
    stratified_subset,
)


def _counts(labels):
    return torch.bincount(labels.clamp(min=-1) + 1)


def test_subset_size_sorted_and_proportional():
    y = torch.tensor([0] * 60 + [1] * 30 + [2] * 10)
    idx = stratified_subset(y, 20, seed=0)
    assert idx.dtype == torch.long and len(idx) == 20
    assert torch.equal(idx, idx.sort().values) and len(idx.unique()) == 20
    assert _counts(y[idx]).tolist() == [0, 12, 6, 2]  # exact 20 * (0.6, 0.3, 0.1)


def test_subset_largest_remainder_and_at_least_one_per_class():
    y = torch.tensor([0] * 6 + [1] * 3 + [2])
    # quotas 3, 1.5, 0.5: the rare class still gets one, at the expense of the largest
    assert _counts(y[stratified_subset(y, 5, seed=3)]).tolist() == [0, 3, 1, 1]
    # quotas 4.2, 2.1, 0.7 -> floors 4, 2, 0 and the one left goes to the largest remainder
    assert _counts(y[stratified_subset(y, 7, seed=3)]).tolist() == [0, 4, 2, 1]
    # fewer places than classes: no minimum, the largest remainders win
    assert _counts(y[stratified_subset(y, 2, seed=3)]).tolist() == [0, 1, 1]


def test_negative_labels_are_one_group():
    y = torch.tensor([-1] * 5 + [-7] * 5 + [0] * 10)
    counts = _counts(y[stratified_subset(y, 10, seed=0)])
    assert counts.tolist() == [5, 5]  # 10 unknown (one group) vs 10 of class 0


def test_subset_deterministic_seeded_and_global_rng_free():
    y = torch.arange(200) % 3
    torch.manual_seed(1)
    a = stratified_subset(y, 50, seed=7)
    state = torch.get_rng_state()
    torch.manual_seed(99)
    b = stratified_subset(y, 50, seed=7)
    assert torch.equal(a, b)
    torch.manual_seed(1)
    stratified_subset(y, 50, seed=7)
    assert torch.equal(torch.get_rng_state(), state)  # the global generator is not drawn from
    assert not torch.equal(a, stratified_subset(y, 50, seed=8))


def test_subset_edges():
    y = torch.tensor([0, 1, 1])
    assert torch.equal(stratified_subset(y, 3, 0), torch.arange(3))
    assert torch.equal(stratified_subset(y, 10, 0), torch.arange(3))
    assert len(stratified_subset(y, 0, 0)) == 0
    with pytest.raises(ValueError, match="size must be >= 0"):
        stratified_subset(y, -1, 0)


@pytest.mark.parametrize("case", range(60))
def test_subset_properties(case):
    rng = random.Random(case)
    counts = [rng.randint(1, 40) for _ in range(rng.randint(1, 6))]
    frac, seed = rng.random(), rng.randrange(2**31)
    y = torch.cat([torch.full((c,), k) for k, c in enumerate(counts)])
    n, groups = len(y), len(counts)
    size = round(frac * n)
    idx = stratified_subset(y, size, seed)
    assert len(idx) == size and len(idx.unique()) == size and (idx < n).all()
    got = torch.bincount(y[idx], minlength=groups).double()
    quota = size * torch.tensor(counts).double() / n
    if size >= groups:
        assert (got >= 1).all()
    if size < groups or (quota >= 1).all():  # the minimum-one rule cannot have moved anything
        assert ((got - quota).abs() < 1).all(), (got, quota)


def test_split_sizes_disjoint_stratified_and_deterministic():
    y = torch.tensor([0] * 80 + [1] * 40 + [2] * 80)
    s = stratified_split(y, {"val": 0.1, "test": 30}, seed=0)
    assert list(s) == ["val", "test", "train"]
    assert [len(s[k]) for k in s] == [20, 30, 150]
    union = torch.cat(list(s.values()))
    assert torch.equal(union.sort().values, torch.arange(200))
    assert _counts(y[s["val"]]).tolist() == [0, 8, 4, 8]
    assert _counts(y[s["test"]]).tolist() == [0, 12, 6, 12]
    again = stratified_split(y, {"val": 0.1, "test": 30}, seed=0)
    assert all(torch.equal(s[k], again[k]) for k in s)
    other = stratified_split(y, {"val": 0.1, "test": 30}, seed=1)
    assert not torch.equal(s["val"], other["val"])
    assert "train" not in stratified_split(y, {"val": 5}, seed=0, rest=None)


def test_split_leaves_every_class_to_training():
    y = torch.tensor([0] * 20 + [1, 2])  # two singleton classes
    s = stratified_split(y, {"val": 3, "test": 3}, seed=0)
    assert set(y[s["train"]].tolist()) == {0, 1, 2}


def test_split_errors():
    y = torch.tensor([0, 1] * 5)
    with pytest.raises(ValueError, match="add up to more than the 10"):
        stratified_split(y, {"val": 6, "test": 5}, 0)
    with pytest.raises(ValueError, match="must be in"):
        stratified_split(y, {"val": 1.5}, 0)
    with pytest.raises(ValueError, match="size for 'val'"):
        stratified_split(y, {"val": -2}, 0)


@pytest.fixture
def sorted_toy():
    """A dataset whose every split and OOD set is sorted by label (like the CIFAR files)."""
    n = 40
    x = [f"text number {i} of class {i // 20}" for i in range(3 * n)]
    y = torch.tensor([(i % n) // (n // 2) for i in range(3 * n)])  # 0 * 20 + 1 * 20 per split
    ood_x = [f"other {i}" for i in range(30)]
    ood_y = torch.tensor([0] * 15 + [1] * 15)

    @register_dataset("sorted_toy_test_only", protocols=("a",), modality="text")
    def _toy(*, protocol, root, split_seed, cache_dir):
        return RawData(x, y, {s: torch.arange(k * n, (k + 1) * n)
                              for k, s in enumerate(("train", "val", "test"))},
                       {"other": (ood_x, ood_y)}, 2, classes=["neg", "pos"])

    yield
    del DATASETS["sorted_toy_test_only"]


def test_limit_eval_on_label_sorted_sets_keeps_both_classes(sorted_toy):
    b = load_data("sorted_toy_test_only", limit_train=6, limit_eval=4, max_len=8)
    for ds in (b.train, b.val, b.test, b.ood["other"]):
        counts = torch.bincount(ds.y, minlength=2).tolist()
        assert counts == [len(ds) // 2] * 2, (ds.name, counts)
    assert (len(b.train), len(b.val), len(b.test), len(b.ood["other"])) == (6, 4, 4, 4)
    assert b.info["limit_eval"] == 4 and b.info["sizes"]["other"] == 4
    assert b.classes == ["neg", "pos"]
    # limit_eval follows the split seed, not the training seed
    c = load_data("sorted_toy_test_only", limit_eval=4, max_len=8, seed=5, split_seed=0)
    d = load_data("sorted_toy_test_only", limit_eval=4, max_len=8, seed=0)
    assert torch.equal(c.val.y, d.val.y) and torch.equal(c.val.lengths, d.val.lengths)
    assert torch.equal(c.ood["other"].x, d.ood["other"].x)
    e = load_data("sorted_toy_test_only", limit_eval=4, max_len=8, seed=0, split_seed=3)
    assert not torch.equal(e.ood["other"].x, d.ood["other"].x)


def test_limit_eval_validation_and_cola_sizes():
    with pytest.raises(ValueError, match="limit_eval must be >= 1"):
        load_data("cola", limit_eval=0)
    b = load_data("cola", max_len=8, limit_eval=100)
    full = load_data("cola", max_len=8)
    assert (len(b.val), len(b.test), len(b.ood["cola_ood"])) == (100, 100, 100)
    assert len(b.train) == len(full.train)
    for small, big in ((b.test, full.test), (b.ood["cola_ood"], full.ood["cola_ood"])):
        share = float(big.y.float().mean())
        assert abs(int(small.y.sum()) - 100 * share) < 1  # largest-remainder proportions
    assert b.fingerprint != full.fingerprint
