"""Transfer with one-vs-rest linear SVMs on frozen features (the VOC07 protocol,
docs/method.md): test mAP, and the argmax's accuracy on single-label data."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: The cost grid of the VOC07 SVM protocol (docs/method.md#evaluation-protocols).
VOC07_COSTS: tuple[float, ...] = (1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03,
                                  0.1, 0.3, 1, 2, 5, 10, 15, 20, 50, 100, 200, 500, 1000)


@dataclass
class SVMResult:
    """``mean_ap`` and ``accuracy`` in percent (``accuracy`` None for multi-label data);
    ``scores`` are the test decision values ``[N, C]``; ``costs`` the chosen C per class."""

    mean_ap: float
    per_class_ap: list[float]
    costs: list[float]
    accuracy: float | None
    scores: np.ndarray
    predictions: np.ndarray | None

    def metrics(self) -> dict[str, object]:
        return {"mAP": self.mean_ap, "accuracy": self.accuracy, "costs": self.costs,
                "per_class_ap": self.per_class_ap}


def _indicator(y: np.ndarray, num_classes: int | None) -> np.ndarray:
    y = np.asarray(y)
    if y.ndim == 1:
        c = num_classes or int(y.max()) + 1
        return (y[:, None] == np.arange(c)[None, :]).astype(np.int64)
    if y.ndim == 2:
        if not np.isin(y, (-1, 0, 1)).all():
            raise ValueError("multi-label targets must be 1 (positive), 0 (negative) or -1 "
                             "(ignored, e.g. VOC 'difficult')")
        return y.astype(np.int64)
    raise ValueError(f"labels must be [N] class indices or [N, C] indicators, got {y.shape}")


def svm_transfer(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    costs: tuple[float, ...] = VOC07_COSTS,
    folds: int = 3,
    seed: int = 0,
    max_iter: int = 2000,
) -> SVMResult:
    """One ``LinearSVC`` per class on L2-normalized features, C chosen by ``folds``-fold CV
    (average precision) on the training split. Labels -1 (multi-label) are left out of that
    class's training and AP."""
    from sklearn.metrics import average_precision_score
    from sklearn.model_selection import GridSearchCV, StratifiedKFold
    from sklearn.svm import LinearSVC

    if train_x.ndim != 2 or test_x.ndim != 2 or train_x.shape[1] != test_x.shape[1]:
        raise ValueError(f"features must be [N, D] with equal D, got {train_x.shape}, "
                         f"{test_x.shape}")
    if folds < 2 or not costs:
        raise ValueError("need folds >= 2 and a non-empty cost grid")
    single = np.asarray(train_y).ndim == 1
    num_classes = (int(max(np.max(train_y), np.max(test_y))) + 1) if single else None
    ytr, yte = _indicator(train_y, num_classes), _indicator(test_y, num_classes)
    if ytr.shape[1] != yte.shape[1]:
        raise ValueError(f"train and test have {ytr.shape[1]} and {yte.shape[1]} classes")
    train_x = train_x / np.maximum(np.linalg.norm(train_x, axis=1, keepdims=True), 1e-12)
    test_x = test_x / np.maximum(np.linalg.norm(test_x, axis=1, keepdims=True), 1e-12)
    scores = np.zeros((len(test_x), ytr.shape[1]))
    aps, chosen = [], []
    for c in range(ytr.shape[1]):
        keep = ytr[:, c] >= 0
        target = ytr[keep, c]
        if target.min() == target.max():
            raise ValueError(f"class {c} has only {'positive' if target[0] else 'negative'} "
                             "training examples; an SVM cannot be trained")
        n_folds = min(folds, int(np.bincount(target).min()))
        if n_folds < 2:
            raise ValueError(f"class {c} has fewer than 2 positive or negative training "
                             "examples, too few for cross-validation")
        search = GridSearchCV(
            LinearSVC(max_iter=max_iter, random_state=seed),
            {"C": list(costs)}, scoring="average_precision",
            cv=StratifiedKFold(n_folds, shuffle=True, random_state=seed))
        search.fit(train_x[keep], target)
        chosen.append(float(search.best_params_["C"]))
        scores[:, c] = search.best_estimator_.decision_function(test_x)
        valid = yte[:, c] >= 0
        aps.append(100 * float(average_precision_score(yte[valid, c], scores[valid, c])))
    predictions = scores.argmax(axis=1) if single else None
    accuracy = (100 * float(np.mean(predictions == np.asarray(test_y)))
                if predictions is not None else None)
    return SVMResult(mean_ap=float(np.mean(aps)), per_class_ap=aps, costs=chosen,
                     accuracy=accuracy, scores=scores, predictions=predictions)
