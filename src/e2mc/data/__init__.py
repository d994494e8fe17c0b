"""Data for continued pre-training and evaluation: datasets (IDX, image folders, numpy arrays,
the shipped Fashion-MNIST subset), label-fraction subsets, view recipes and the eval transform."""

from .build import build_dataset
from .datasets import (
    FASHION_MNIST_CLASSES,
    MNIST_CLASSES,
    ArrayDataset,
    builtin_fashion_mnist,
    builtin_fashion_mnist_path,
    fashion_mnist,
    idx_dataset,
    mnist,
    npz_dataset,
)
from .idx import load_idx, save_idx
from .image_folder import SafeImageFolder, image_folder
from .multiview import MultiViewDataset, ViewBatch, collate_views
from .subsets import (
    LabeledSubset,
    Transformed,
    dataset_labels,
    label_fraction_indices,
    per_class_indices,
    read_file_list,
    subset_from_file_list,
    subset_parts,
)
from .views import (
    DATASET_STATS,
    blur_kernel_size,
    build_views,
    default_normalization,
    eval_transform,
)

__all__ = ["DATASET_STATS", "FASHION_MNIST_CLASSES", "MNIST_CLASSES", "ArrayDataset",
           "LabeledSubset", "MultiViewDataset", "SafeImageFolder", "Transformed",
           "blur_kernel_size", "build_dataset", "build_views", "builtin_fashion_mnist",
           "builtin_fashion_mnist_path", "ViewBatch", "collate_views", "dataset_labels",
           "default_normalization", "eval_transform", "fashion_mnist", "idx_dataset",
           "image_folder", "label_fraction_indices", "load_idx", "mnist", "npz_dataset",
           "per_class_indices", "read_file_list", "save_idx", "subset_from_file_list",
           "subset_parts"]
