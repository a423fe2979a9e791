"""data.resident: a dataset held on the training device gathers, trims and augments there,
reading nothing back from the device; on the CPU it is the dataset itself."""

import torch

from gpattn_ppl.data.cifar import Normalize, augment
from gpattn_ppl.data.dataset import ArrayDataset
from gpattn_ppl.run.training import resident_data


def _text():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 9, (20,), generator=g)
    x = torch.randint(1, 50, (20, 8), generator=g) * (torch.arange(8) < lengths[:, None])
    return ArrayDataset(x, torch.randint(0, 2, (20,), generator=g), lengths, name="t")


def test_to_the_same_device_is_the_dataset_itself():
    d = _text()
    assert d.to("cpu") is d and d.device == torch.device("cpu")


def test_a_resident_text_batch_reads_no_device_value():
    """On the meta device every value read (``int(t)``, ``.item()``) raises: trimming to the
    longest sequence uses the host copy of the lengths."""
    d = _text()
    r = d.to("meta")
    idx = torch.tensor([3, 7, 1])
    b, ref = r.batch(idx), d.batch(idx)
    assert b.x.device.type == "meta" and b.mask.device.type == "meta"
    assert b.x.shape == ref.x.shape and b.mask.shape == ref.mask.shape
    assert r.lengths.device.type == "meta" and len(r) == len(d)


def test_a_resident_image_batch_is_augmented_on_its_device():
    x = torch.randint(0, 256, (10, 3, 8, 8), dtype=torch.uint8)
    d = ArrayDataset(x, torch.zeros(10, dtype=torch.long), name="img",
                     augment=lambda b, g: augment(b, g), transform=Normalize())
    r = d.to("meta")
    b = r.batch(torch.tensor([0, 4]), train=True, generator=torch.Generator().manual_seed(0))
    assert b.x.device.type == "meta" and b.x.shape == (2, 3, 8, 8)
    assert b.x.dtype == torch.float32 and r.x.dtype == torch.uint8


def test_resident_is_chosen_automatically_on_cuda_only():
    assert resident_data("auto", torch.device("cuda", 0))
    assert not resident_data("auto", torch.device("cpu"))
    assert resident_data(True, torch.device("cpu")) and not resident_data(False, torch.device("cuda"))
