"""In-memory datasets that hand out :class:`~gpattn_ppl.data.batch.Batch` objects by index.

Whole datasets at this library's scale fit in memory as padded tensors; slicing by an index tensor
is much faster than a per-item ``DataLoader`` + collate in Python.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .batch import Batch, to_device

__all__ = ["ArrayDataset"]


class ArrayDataset:
    """A labelled dataset held as tensors.

    :param x: ``[n, N_max]`` long token ids (0 = padding), ``[n, N_max, F]`` float token features,
        or ``[n, 3, height, width]`` images (uint8 or float).
    :param y: ``[n]`` integer labels.
    :param lengths: ``[n]`` number of real tokens per sequence (text only); ``None`` for images.
    :param name: used in error messages and result tables.
    :param augment: ``f(x_batch, generator) -> x_batch`` applied to training batches only.
    :param transform: ``f(x_batch) -> x_batch`` applied to every batch (e.g. uint8 -> normalised
        float images).
    :raises ValueError: on an empty dataset, mismatched lengths, or lengths out of range.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, lengths: torch.Tensor | None = None,
                 name: str = "dataset", augment: Callable | None = None,
                 transform: Callable | None = None) -> None:
        if x.shape[0] == 0:
            raise ValueError(f"dataset '{name}' is empty (0 examples)")
        if y.shape != (x.shape[0],):
            raise ValueError(f"dataset '{name}': labels have shape {tuple(y.shape)}, expected "
                             f"({x.shape[0]},) to match x of shape {tuple(x.shape)}")
        if lengths is not None:
            if lengths.shape != (x.shape[0],):
                raise ValueError(f"dataset '{name}': lengths shape {tuple(lengths.shape)} != "
                                 f"({x.shape[0]},)")
            if int(lengths.min()) < 1:
                bad = int((lengths < 1).nonzero()[0])
                raise ValueError(f"dataset '{name}': example {bad} has no real tokens "
                                 "(an all-padding sequence)")
            if int(lengths.max()) > x.shape[1]:
                raise ValueError(f"dataset '{name}': a length exceeds the padded width {x.shape[1]}")
        self.x, self.y, self.lengths = x, y.long(), lengths
        self.name, self.augment, self.transform = name, augment, transform

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def device(self) -> torch.device:
        """Where the examples are held (batches are gathered there)."""
        return self.x.device

    def to(self, device: torch.device | str) -> ArrayDataset:
        """The same dataset held on ``device``: images stay uint8 and token ids long there, and
        :meth:`batch` gathers, normalises and augments on it (no host copy per batch). The
        lengths stay on the host too, so trimming a text batch reads no device value."""
        device = torch.device(device)
        if self.x.device == device:
            return self
        out = ArrayDataset.__new__(ArrayDataset)
        out.__dict__.update(self.__dict__)
        out.x, out.y = self.x.to(device), self.y.to(device)
        out._host_lengths = self.lengths
        out.lengths = None if self.lengths is None else self.lengths.to(device)
        return out

    def batch(self, index: torch.Tensor, *, train: bool = False,
              generator: torch.Generator | None = None) -> Batch:
        """The examples at ``index`` as a :class:`Batch`; text is trimmed to the longest in it."""
        index = torch.as_tensor(index, dtype=torch.long)
        host = index
        if self.x.device != index.device:  # a resident dataset (to): gather on its device
            index = to_device(index, self.x.device)
        x = self.x[index]
        mask = None
        if self.lengths is not None:
            lengths = self.lengths[index]
            host_lengths = getattr(self, "_host_lengths", None)
            n = int((lengths if host_lengths is None else host_lengths[host]).max())
            x = x[:, :n]
            mask = torch.arange(n, device=x.device).unsqueeze(0) < lengths.unsqueeze(1)
        if self.transform is not None:
            x = self.transform(x)
        if train and self.augment is not None:
            x = self.augment(x, generator)
        return Batch(x=x, y=self.y[index], mask=mask, index=index)

    def batches(self, batch_size: int, *, shuffle: bool = False,
                generator: torch.Generator | None = None, train: bool = False):
        """Iterate over minibatches (a seeded permutation when ``shuffle``)."""
        n = len(self)
        order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
        for start in range(0, n, batch_size):
            yield self.batch(order[start:start + batch_size], train=train, generator=generator)

    def subset(self, index: torch.Tensor, name: str | None = None) -> ArrayDataset:
        """A new dataset with the rows at ``index`` (same augmentation and transform)."""
        index = torch.as_tensor(index, dtype=torch.long, device=self.x.device)
        return ArrayDataset(self.x[index], self.y[index],
                            None if self.lengths is None else self.lengths[index],
                            name=name or self.name, augment=self.augment,
                            transform=self.transform)
