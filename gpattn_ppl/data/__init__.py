"""Datasets, splits and input encoders; start with :func:`load_data`.

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
from .pretrained import MiniLMEncoder
from .registry import (
    DATASETS,
    TEXT_ENCODERS,
    DataBundle,
    DatasetSpec,
    RawData,
    load_data,
    register_dataset,
)
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
    "decode_jpeg_array",
    "load_data",
    "read_cifar10",
    "read_cola",
    "read_cr",
    "read_imdb",
    "register_dataset",
]
