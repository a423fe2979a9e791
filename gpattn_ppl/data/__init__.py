"""Datasets, splits and input encoders; start with :func:`load_data`.

Each reader module (:mod:`~gpattn_ppl.data.cola`, :mod:`~gpattn_ppl.data.imdb`,
:mod:`~gpattn_ppl.data.cifar`) registers its dataset on import with
:func:`~gpattn_ppl.data.registry.register_dataset`, as the attention units do.

>>> from gpattn_ppl.data import load_data
>>> bundle = load_data("cola", protocol="official")
>>> bundle.input_kind, bundle.num_classes
('tokens', 2)
"""

from .batch import Batch
from .cifar import (
    CIFAR10_CLASSES,
    CIFAR10_MEAN,
    CIFAR10_STD,
    Normalize,
    augment,
    decode_jpeg_array,
    read_cifar10,
)
from .cola import COLA_FILES, bundled_cola_root, read_cola
from .cr import read_cr
from .dataset import ArrayDataset
from .imdb import read_imdb
from .load import TEXT_ENCODERS, DataBundle, load_data
from .pretrained import MiniLMEncoder
from .registry import DATASETS, DatasetSpec, RawData, register_dataset
from .splits import cut, official_split, pool, seeded_permutation
from .tokenizer import WordTokenizer

__all__ = [
    "ArrayDataset",
    "Batch",
    "CIFAR10_CLASSES",
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "COLA_FILES",
    "DATASETS",
    "DataBundle",
    "DatasetSpec",
    "MiniLMEncoder",
    "Normalize",
    "RawData",
    "TEXT_ENCODERS",
    "WordTokenizer",
    "augment",
    "bundled_cola_root",
    "cut",
    "decode_jpeg_array",
    "load_data",
    "official_split",
    "pool",
    "read_cifar10",
    "read_cola",
    "read_cr",
    "read_imdb",
    "register_dataset",
    "seeded_permutation",
]
