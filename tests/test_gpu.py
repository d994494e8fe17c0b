"""On a CUDA GPU (marker ``gpu``; each skips with one line where CUDA is absent). Run by
``scripts/gpu-check.sh`` with the GPU benchmarks; ``python -m pytest -m gpu`` alone runs these.

- a run on CUDA through each input pipeline and each mixed precision (fp16 with its scaler,
  bf16), channels_last, past every callback (the checks of tests/test_training_matrix.py);
- every method through the device pipeline on CUDA, past every callback;
- the criterion on CUDA equal to the CPU's, values and gradients;
- a run killed with SIGKILL on CUDA and resumed, against an uninterrupted one;
- ``torchrun`` with one process on CUDA;
- evaluation features on CUDA against the CPU's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import TINY_RUN, killed_and_resumed, tiny_base, training_records
from test_training_matrix import METHODS, PIPELINES, assert_every_callback_acted, images, train

pytestmark = pytest.mark.gpu
__all__ = ["images"]  # the image folder fixture of the training matrix, used here too

SRC = str(Path(__file__).resolve().parents[1] / "src")
ENV = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
       "OMP_NUM_THREADS": "1"}
#: TINY_RUN on the GPU
ON_CUDA = [s for s in TINY_RUN if not s.startswith(("training.device", "training.cpu_threads"))] \
    + ["training.device=cuda"]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_run_on_cuda_through_every_pipeline_and_precision(
        images: Path, tmp_path: Path, pipeline: str, precision: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    err = train(images, run, "vicreg", pipeline, "e2mc", capsys, device="cuda",
                extra=(f"training.precision={precision}", "training.channels_last=true"))
    assert_every_callback_acted(run, err, "e2mc")


@pytest.mark.parametrize("method", METHODS)
def test_every_method_through_the_device_pipeline_on_cuda(
        images: Path, tmp_path: Path, method: str, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    err = train(images, run, method, "device", "e2mc", capsys, device="cuda",
                extra=("training.precision=bf16", "training.channels_last=true"))
    assert_every_callback_acted(run, err, "e2mc")


@pytest.mark.parametrize("space", ["hypercube", "hypersphere"])
def test_the_criterion_on_cuda_equals_the_cpu(space: str) -> None:
    """float64, continuous random inputs (no ties, so that the two sorts order alike):
    the loss, its terms and the input gradients agree to 1e-9 relative."""
    from e2mc import E2MC

    g = torch.Generator().manual_seed(0)
    views = [torch.randn(512, 256, dtype=torch.float64, generator=g) for _ in range(2)]
    results = {}
    for device in ("cpu", "cuda"):
        zs = [v.to(device).requires_grad_(True) for v in views]
        terms = E2MC(space=space, beta=1000.0, gamma=100.0)(zs)
        terms["loss"].backward()
        results[device] = ({k: float(v) for k, v in terms.items()},
                           [z.grad.cpu() for z in zs])
    (cpu_terms, cpu_grads), (gpu_terms, gpu_grads) = results["cpu"], results["cuda"]
    assert cpu_terms.keys() == gpu_terms.keys()
    for key, value in cpu_terms.items():
        assert gpu_terms[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    for a, b in zip(cpu_grads, gpu_grads, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-12)


def test_a_run_killed_on_cuda_resumes_to_the_uninterrupted_run(tmp_path: Path) -> None:
    """SIGKILL mid-run (a checkpoint every step), then the same command: the same steps, and
    weights within 1e-4 relative of the uninterrupted run's. The tolerance: cuDNN's backward
    kernels may sum in another order from one run to the next, so two uninterrupted CUDA runs
    need not agree bit for bit either; where they do here, the resumed run must too."""

    base, data = tiny_base(tmp_path)
    args = ["continue", "--config", "fmnist-vicreg-e2mc", "--from", str(base),
            "--data", str(data), *[a for s in ON_CUDA for a in ("--set", s)],
            "--set", "training.checkpoint_every_steps=1", "--set", "training.batch_size=6",
            "--set", "training.max_steps=6"]
    a, b, killed = killed_and_resumed(args, tmp_path, ENV)
    assert [m["step"] for m in training_records(killed)] == list(range(1, 7))
    worst = 0.0
    for key, value in a["model"].items():
        if value.is_floating_point():
            scale = max(float(value.abs().max()), 1e-6)
            worst = max(worst, float((value - b["model"][key]).abs().max()) / scale)
        else:
            assert torch.equal(value, b["model"][key]), key
    print(f"largest relative weight difference, resumed vs uninterrupted: {worst:.2e}")
    assert worst <= 1e-4


def test_torchrun_with_one_process_on_cuda(tmp_path: Path) -> None:
    base, data = tiny_base(tmp_path)
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
           "-m", "e2mc", "continue", "--config", "fmnist-vicreg-e2mc", "--from",
           str(base), "--data", str(data), "--out", str(run),
           *[a for s in ON_CUDA for a in ("--set", s)], "--set", "training.max_steps=3"]
    done = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert torch.load(run / "checkpoint.pt", weights_only=True)["step"] == 3


@pytest.mark.parametrize("autocast,tolerance", [(False, 2e-3), (None, 3e-2)],
                         ids=["fp32", "default-bf16"])
def test_evaluation_features_on_cuda_match_the_cpu(autocast: bool | None,
                                                   tolerance: float) -> None:
    """The shipped base's features of 512 shipped test images. In float32 CUDA may use TF32
    for convolutions (10-bit mantissa): within 2e-3 of the CPU's, relative to the features'
    norm. The default on an accelerator, bf16 autocast (8-bit mantissa): within 3e-2, and the
    nearest training neighbour of 98% of the images the same."""
    from torch.utils.data import Subset

    from e2mc.artifacts import builtin_checkpoint
    from e2mc.checkpoints import load_backbone
    from e2mc.data import build_dataset, eval_transform
    from e2mc.evaluation.features import extract_features

    backbone, _, _ = load_backbone(str(builtin_checkpoint("builtin:demo-vicreg")))
    test = Subset(build_dataset("builtin", "test", eval_transform(28, 1)), range(512))
    cpu, labels = extract_features(backbone, test, device="cpu", progress=False, num_workers=0)
    gpu, labels_gpu = extract_features(backbone, test, device="cuda", progress=False,
                                       num_workers=0, autocast=autocast)
    assert (labels == labels_gpu).all()
    cpu_t, gpu_t = torch.from_numpy(cpu), torch.from_numpy(gpu)
    error = float((gpu_t - cpu_t).norm() / cpu_t.norm())
    print(f"relative feature difference, CUDA ({'bf16' if autocast is None else 'fp32'}) vs "
          f"CPU: {error:.2e}")
    assert error <= tolerance
    nearest = [torch.cdist(x[:256], x[256:]).argmin(1) for x in (cpu_t, gpu_t)]
    assert float((nearest[0] == nearest[1]).float().mean()) >= 0.98
