"""What a data set's images are (:func:`image_shape`): size, channels and class count, read off
the images themselves (the presets for your own data take them from it)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from e2mc.data.subsets import dataset_labels

#: The images looked at: the first ones of the data set.
LOOKED_AT = 16
#: The largest size taken from the data: larger images are cropped to it (ImageNet's size).
MAX_SIZE = 224


@dataclass(frozen=True)
class ImageShape:
    """``size``: the most common shorter side of the first images, at most :data:`MAX_SIZE`
    (``native``: before that cap); ``channels``: 1 when they are all grayscale, else 3;
    ``classes``: the number of classes (None without labels); ``images``: how many."""

    size: int
    native: int
    channels: int
    classes: int | None
    images: int

    def describe(self) -> str:
        """``32 px RGB images, 10 classes`` (how a command says what it read)."""
        size = f"{self.size} px" if self.size == self.native else \
            f"{self.native} px (cropped to {self.size})"
        kind = "grayscale" if self.channels == 1 else "RGB"
        classes = "" if self.classes is None else f", {self.classes} classes"
        return f"{size} {kind} images{classes}"


def image_shape(dataset: Any) -> ImageShape:
    """The shape of the images of ``dataset`` (items ``(PIL image, label)``)."""
    if len(dataset) == 0:
        raise ValueError("the data set holds no images")
    sides: Counter[int] = Counter()
    gray = True
    for i in range(min(LOOKED_AT, len(dataset))):
        image = dataset[i][0]
        sides[min(image.size)] += 1
        gray = gray and image.mode in ("L", "1", "I", "I;16", "F")
    native = sides.most_common(1)[0][0]
    labels = dataset_labels(dataset, False)
    known = None if labels is None else labels[labels >= 0]
    classes = getattr(dataset, "classes", None)
    count = len(classes) if classes else (
        int(known.max()) + 1 if known is not None and known.size else None)
    return ImageShape(min(native, MAX_SIZE), native, 1 if gray else 3, count, len(dataset))
