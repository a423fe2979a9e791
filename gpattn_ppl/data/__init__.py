"""Datasets, splits and input encoders; start with :func:`load_data`.

Each reader module (:mod:`~gpattn_ppl.data.cola`, :mod:`~gpattn_ppl.data.imdb`,
:mod:`~gpattn_ppl.data.clinc150`, :mod:`~gpattn_ppl.data.cifar`, and for your own files
:mod:`~gpattn_ppl.data.tabular` (``csv``, ``jsonl``) and :mod:`~gpattn_ppl.data.image_folder`)
registers its dataset on import with :func:`~gpattn_ppl.data.registry.register_dataset`, as the
attention units do. New inputs
are encoded like a bundle's splits by :func:`encoder_from_state` of ``bundle.encoder_state``.

>>> from gpattn_ppl.data import load_data
>>> bundle = load_data("cola", protocol="official")
>>> bundle.input_kind, bundle.num_classes
('tokens', 2)
"""

from .batch import Batch, to_device
from .cifar import (
    CIFAR10_CLASSES,
    CIFAR10_MEAN,
    CIFAR10_STD,
    Normalize,
    augment,
    decode_jpeg_array,
    read_cifar10,
)
from .clinc150 import (
    CLINC150_FILES,
    CLINC150_NEAR_OOD_DOMAINS,
    bundled_clinc150_demo_root,
    bundled_clinc150_slice_root,
    clinc150_held_out_domains,
    read_clinc150,
)
from .cola import COLA_CLASSES, COLA_FILES, bundled_cola_root, read_cola
from .corruptions import (
    CORRUPTION_CATEGORIES,
    CORRUPTIONS,
    EXTRA_CORRUPTIONS,
    corrupt,
    corrupted_sets,
    parse_corruption_sets,
)
from .cr import read_cr
from .dataset import ArrayDataset
from .encoders import (
    ENCODER_KINDS,
    HFTokenEncoder,
    ImageEncoder,
    InputEncoder,
    LearnedTextEncoder,
    MiniLMTextEncoder,
    encoder_from_state,
)
from .hf_folder import (
    HOST_TYPE_ATTR,
    SWAPPED_TYPE_PREFIX,
    HFFolderError,
    check_model_folder,
    checkpoint_record,
    digest_differences,
    dtype_kind,
    folder_digest,
    locate_checkpoint,
    minilm_folder,
    read_config_json,
    resolve_checkpoint,
    safetensors_dtypes,
    swapped_host_type,
    weight_files,
)
from .image_folder import IMAGE_EXTENSIONS, read_image, read_image_folder, read_images
from .imdb import IMDB_CLASSES, read_imdb
from .load import (
    TEXT_ENCODERS,
    DataBundle,
    check_labels,
    checkpoint_positions,
    data_fingerprint,
    load_data,
)
from .pretrained import MiniLMEncoder, load_tokenizer
from .registry import DATASETS, DatasetSpec, RawData, register_dataset
from .splits import (
    cut,
    official_split,
    pool,
    seeded_permutation,
    stratified_split,
    stratified_subset,
)
from .tabular import read_labelled_texts, read_text_lines, read_texts, resolve_path
from .tokenizer import WordTokenizer
from .vision_ood import VISION_OOD, digit_images, noise_images, photo_patches, vision_ood_sets

__all__ = [
    "ArrayDataset",
    "Batch",
    "CIFAR10_CLASSES",
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "CLINC150_FILES",
    "CLINC150_NEAR_OOD_DOMAINS",
    "COLA_CLASSES",
    "CORRUPTIONS",
    "CORRUPTION_CATEGORIES",
    "COLA_FILES",
    "DATASETS",
    "DataBundle",
    "DatasetSpec",
    "ENCODER_KINDS",
    "EXTRA_CORRUPTIONS",
    "HFFolderError",
    "HFTokenEncoder",
    "HOST_TYPE_ATTR",
    "IMAGE_EXTENSIONS",
    "IMDB_CLASSES",
    "ImageEncoder",
    "InputEncoder",
    "LearnedTextEncoder",
    "MiniLMEncoder",
    "MiniLMTextEncoder",
    "Normalize",
    "RawData",
    "SWAPPED_TYPE_PREFIX",
    "TEXT_ENCODERS",
    "VISION_OOD",
    "WordTokenizer",
    "augment",
    "bundled_clinc150_demo_root",
    "bundled_clinc150_slice_root",
    "bundled_cola_root",
    "check_labels",
    "checkpoint_positions",
    "check_model_folder",
    "checkpoint_record",
    "clinc150_held_out_domains",
    "corrupt",
    "corrupted_sets",
    "cut",
    "data_fingerprint",
    "decode_jpeg_array",
    "digest_differences",
    "digit_images",
    "dtype_kind",
    "encoder_from_state",
    "folder_digest",
    "load_data",
    "load_tokenizer",
    "locate_checkpoint",
    "noise_images",
    "official_split",
    "parse_corruption_sets",
    "photo_patches",
    "pool",
    "read_cifar10",
    "read_clinc150",
    "read_cola",
    "read_config_json",
    "read_cr",
    "read_image",
    "read_image_folder",
    "read_images",
    "read_imdb",
    "read_labelled_texts",
    "read_text_lines",
    "read_texts",
    "register_dataset",
    "minilm_folder",
    "resolve_checkpoint",
    "safetensors_dtypes",
    "resolve_path",
    "seeded_permutation",
    "stratified_split",
    "stratified_subset",
    "swapped_host_type",
    "to_device",
    "vision_ood_sets",
    "weight_files",
]
