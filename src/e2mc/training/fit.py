"""A configuration fitted to its data (:func:`fit_to_data`): image size and channels left None
take the images' own, and ``training.fit_batch`` shrinks a batch that would leave more than
:data:`MAX_LEFT_OUT` of the images out of every epoch; each value is said with its reason."""

from __future__ import annotations

import dataclasses
from typing import Any

from e2mc.config import RunConfig
from e2mc.training.hardware import Choice

#: The most of the training images an epoch may leave out with ``training.fit_batch`` (every
#: step takes a full batch: the remainder ``images % batch`` sits out each epoch).
MAX_LEFT_OUT = 0.05


def needs_data(cfg: RunConfig) -> bool:
    """Whether ``cfg`` leaves a value to its data."""
    return (cfg.data.image_size is None or cfg.data.channels is None
            or cfg.model.in_channels is None or cfg.training.fit_batch)


def fit_batch(images: int, largest: int) -> int:
    """The largest batch up to ``largest`` that leaves at most :data:`MAX_LEFT_OUT` out."""
    if images <= largest:
        return max(images, 1)
    return next(b for b in range(largest, 0, -1) if images % b <= MAX_LEFT_OUT * images)


def fit_to_data(cfg: RunConfig, images: Any = None) -> tuple[RunConfig, dict[str, Choice]]:
    """``cfg`` with the values it leaves to its data filled in, and each :class:`Choice`; ``cfg``
    itself when it leaves none (the data are then not read)."""
    if not needs_data(cfg):
        return cfg, {}
    from e2mc.data.holdout import holdout_split
    from e2mc.data.shape import image_shape
    from e2mc.data.subsets import dataset_labels
    from e2mc.training.build import training_images

    dataset = (images or training_images(cfg))[0]
    shape = image_shape(dataset)
    read = f"the data: {shape.describe()}"  # (said once, with the first value it sets)
    data, model, training = cfg.data, cfg.model, cfg.training
    chosen: dict[str, Choice] = {}
    if data.image_size is None:
        data = dataclasses.replace(data, image_size=shape.size)
        chosen["data.image_size"] = Choice(shape.size, read)
    if data.channels is None:
        data = dataclasses.replace(data, channels=shape.channels)
        chosen["data.channels"] = Choice(shape.channels, "RGB images" if shape.channels == 3
                                         else "grayscale images")
    if model.in_channels is None:
        model = dataclasses.replace(model, in_channels=data.channels)
        chosen["model.in_channels"] = Choice(data.channels, "data.channels")
    if training.fit_batch:
        n = len(dataset)
        if data.val_split is not None:
            n = len(holdout_split(n, data.val_split, data.val_seed,
                                  dataset_labels(dataset, False))[0])
        batch = fit_batch(n, training.batch_size)
        steps = n // batch
        chosen["training.batch_size"] = Choice(batch, (
            f"{n} training images: {steps} step(s) of {batch} per epoch, "
            f"{n - steps * batch} left out; at most {training.batch_size}"))
        training = dataclasses.replace(training, batch_size=batch)
    return dataclasses.replace(cfg, data=data, model=model, training=training), chosen
