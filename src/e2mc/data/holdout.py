"""The held-out validation split of a training set: the images that continued training never
sees and on which every choice (learning rate, length, keep-best step) is made, so that the test
split is never used for one."""

from __future__ import annotations

import numpy as np


def holdout_size(n: int, size: float) -> int:
    """Held-out images: ``round(size * n)`` for a fraction, else the whole count ``size``."""
    if 0 < size < 1:
        count = int(round(size * n))
    elif size >= 1 and float(size).is_integer():
        count = int(size)
    else:
        raise ValueError(f"a validation split is a fraction in (0, 1) or a whole count >= 1, "
                         f"got {size}")
    if not 1 <= count < n:
        raise ValueError(f"a validation split of {size} leaves {n - count} of {n} images for "
                         f"training and {count} for validation; both need at least one")
    return count


def holdout_split(n: int, size: float, seed: int, labels: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray, bool]:
    """``(train, validation, stratified)``: sorted, disjoint index arrays covering ``range(n)``,
    stratified by ``labels`` when every class has two images and the validation part can hold
    one of each, else a seeded draw. Depends only on the arguments (every rank agrees)."""
    from sklearn.model_selection import train_test_split

    count = holdout_size(n, size)
    index = np.arange(n)
    stratify = None
    if labels is not None:
        labels = np.asarray(labels)
        if labels.shape != (n,):
            raise ValueError(f"labels must have one entry per image ({n}), got {labels.shape}")
        _, counts = np.unique(labels, return_counts=True)
        if counts.min() >= 2 and len(counts) <= min(count, n - count):
            stratify = labels
    train, val = train_test_split(index, test_size=count, random_state=seed, shuffle=True,
                                  stratify=stratify)
    return np.sort(train), np.sort(val), stratify is not None
