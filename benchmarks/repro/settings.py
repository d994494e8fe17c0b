"""What the reproduction runs: one :class:`ReproSettings`, full size or ``--quick``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from e2mc.artifacts import RunDir

#: The paper's three (the default) and the five beyond it (``--methods``; results/new-methods.md).
PAPER_METHODS = ("vicreg", "swav", "simsiam")
METHODS = (*PAPER_METHODS, "barlowtwins", "simclr", "byol", "mocov3", "dino")
#: Add-ons of the continued runs per method ("none" = the paper's "continued" baseline);
#: SwAV also gets the paper's alternative criteria (Table 3 of the paper).
ADDONS = {"vicreg": ("none", "e2mc"), "swav": ("none", "e2mc", "vcreg", "uniformity", "mmcr"),
          "simsiam": ("none", "e2mc"), "barlowtwins": ("none", "e2mc"),
          "simclr": ("none", "e2mc"), "byol": ("none", "e2mc"), "mocov3": ("none", "e2mc"),
          "dino": ("none", "e2mc")}
ROW_NAMES = {"none": "continued", "e2mc": "+E2MC", "vcreg": "+VCReg", "uniformity": "+AUH",
             "mmcr": "+MMCR", "sigreg": "+SIGReg"}
#: The paper's Table A.2 grid as multiples of the method's preset (beta, gamma): for SwAV
#: (beta, gamma) = (1, 25) these are exactly the paper's pairs; (0, 0) is "continued".
PAPER_ABLATION = ((0, 0), (1, 0), (0, 0.04), (1, 1), (1, 0.004), (0.1, 0.04), (1, 0.04),
                  (1, 0.4), (10, 0.04), (10, 1), (0.1, 1), (0, 1))
STAGES = ("bases", "continue", "eval", "ablation", "epochs", "diagnostics", "report")


@dataclass
class ReproSettings:
    """Every knob of the pipeline. :meth:`quick` shrinks everything for a CI-sized check."""

    data: str = "builtin"
    transfer_data: str | None = None
    out: Path = Path("benchmarks/out/repro")
    methods: tuple[str, ...] = PAPER_METHODS
    seeds: tuple[int, ...] = (0, 1, 2)
    label_seeds: tuple[int, ...] = (0, 1, 2)
    backbone: str | None = None  # None: each preset's own (cnn5_small; DINO's vit_tiny_p4_28)
    image_size: int = 28
    base_epochs: int = 50
    base_seed: int = 0
    continue_epochs: int | None = None  # default: max(1, round(0.1 * base_epochs))
    epochs_factor: int = 3
    epochs_methods: tuple[str, ...] | None = None  # default: every method of the run
    batch_size: int = 256
    train_limit: int | None = None
    test_limit: int | None = None
    fractions: tuple[float, ...] = (0.01, 0.1, 1.0)
    ablation_fractions: tuple[float, ...] = (0.01, 0.1)
    ablation_method: str = "vicreg"
    ablation_pairs: tuple[tuple[float, float], ...] = PAPER_ABLATION
    probe_epochs: int = 100
    probe_preset: str = "method"  # the paper's per-method probe settings, or "generic"
    knn_k: tuple[int, ...] = (20, 200)
    curve_train: int = 10_000
    curve_test: int = 2_000
    diagnostics_samples: int = 2_000
    cpu_threads: int | None = None
    num_workers: int = 0  # data-loading worker processes of every training run
    device: str = "cpu"
    base_runs: dict[str, Path] = field(default_factory=dict)
    base_overrides: list[str] = field(default_factory=list)
    continue_overrides: list[str] = field(default_factory=list)
    e2mc_overrides: list[str] = field(default_factory=list)  # +E2MC runs only
    addons: tuple[str, ...] | None = None  # default: every criterion of ADDONS
    progress: bool = True
    quick_mode: bool = False

    @classmethod
    def quick(cls, **changes: object) -> ReproSettings:
        """Tiny everything: 256 training / 200 test images, 2 base epochs, 1 continued epoch,
        1 seed, 5 probe epochs, a 4-point ablation; well under a minute on 2 cores."""
        base = dict(seeds=(0,), label_seeds=(0,), base_epochs=2, continue_epochs=1,
                    epochs_factor=2, epochs_methods=("vicreg",), batch_size=64,
                    train_limit=256, test_limit=200,
                    ablation_pairs=((0, 0), (1, 0), (0, 1), (1, 1)), probe_epochs=5,
                    knn_k=(20,), curve_train=256, curve_test=200, diagnostics_samples=200,
                    progress=False, quick_mode=True)
        base.update(changes)
        return cls(**base)  # type: ignore[arg-type]

    @property
    def continued_epochs(self) -> int:
        """About 10% of the base epochs, as the paper (1000 -> 1010, 800 -> 810, 100 -> 110)."""
        if self.continue_epochs is not None:
            return self.continue_epochs
        return max(1, round(0.1 * self.base_epochs))

    def validate(self) -> None:
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown or not self.methods:
            raise ValueError(f"unknown method(s) {unknown}; choose from {', '.join(METHODS)}")
        if self.epochs_methods is not None and not set(self.epochs_methods) <= set(METHODS):
            raise ValueError(f"--epochs-methods must be among {METHODS}")
        if self.addons is not None and not set(self.addons) <= set(ROW_NAMES):
            raise ValueError(f"--addons must be among {sorted(ROW_NAMES)}, got {list(self.addons)}")
        if self.ablation_method not in METHODS:
            raise ValueError(f"--ablation-method must be one of {METHODS}")
        if not self.seeds or not self.label_seeds:
            raise ValueError("need at least one training seed and one label-subset seed")
        if self.base_epochs < 1 or self.continued_epochs < 1 or self.epochs_factor < 1:
            raise ValueError("base epochs, continued epochs and --epochs-factor must be >= 1")
        if self.probe_preset not in ("method", "generic"):
            raise ValueError("--probe-preset must be 'method' or 'generic'")
        for f in (*self.fractions, *self.ablation_fractions):
            if not 0 < f <= 1:
                raise ValueError(f"label fractions must be in (0, 1], got {f}")
        for m, path in self.base_runs.items():
            if m not in METHODS:
                raise ValueError(f"--base-run {m}=...: unknown method {m!r}")
            if not RunDir(path).checkpoint.is_file():
                raise ValueError(f"--base-run {m}={path}: no checkpoint.pt in that directory")

    def addons_of(self, method: str) -> tuple[str, ...]:
        """The continued-training criteria of ``method`` in this run ("none" always first):
        ``--addons`` for every method, else the method's default criteria (``ADDONS``)."""
        if self.addons is None:
            return ADDONS[method]
        return ("none", *(a for a in self.addons if a != "none"))

    @property
    def long_methods(self) -> tuple[str, ...]:
        """Methods of the ``epochs`` stage (those of the run among ``epochs_methods``)."""
        if self.epochs_methods is None:
            return self.methods
        return tuple(m for m in self.methods if m in self.epochs_methods)
