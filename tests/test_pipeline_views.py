"""The fast view pipeline against the PIL recipes: same draws for a seed, the same parameter
distributions over thousands of draws (against parameters recorded from torchvision's own
transforms), the per-sample operations against torchvision's kernels, reduced-scale decoding,
and device mode (the loader, batches and corrupt files: tests/test_pipeline_loader.py)."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms.functional as F_v1
import torchvision.transforms.v2.functional as TF
from PIL import Image
from scipy import stats

from e2mc.data import (
    build_views,
    photometric_cv2,
)
from e2mc.data import photometric as P
from e2mc.data.fast_views import (
    DeviceAugment,
    FastViews,
    collate_device_views,
)
from e2mc.data.image_folder import _load_rgb_or_l
from e2mc.data.views import PARAM_FIELDS, draw_view_params
from synthetic_photos import natural_image

BACKENDS = ["torch"] + (["opencv"] if photometric_cv2.available() else [])
FIELD = {name: k for k, name in enumerate(PARAM_FIELDS)}


@pytest.fixture(scope="module")
def jpeg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("jpeg") / "photo.jpg"
    natural_image(np.random.default_rng(0), 160, 120).save(path, "JPEG", quality=90)
    return path


# ----------------------------------------------------------------------------- same draws
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("recipe", ["vicreg", "swav", "simsiam"])
def test_same_seed_gives_the_views_of_build_views(jpeg: Path, recipe: str, backend: str) -> None:
    ref = build_views(recipe, 64, 3)
    fast = FastViews(ref, draft=False, backend=backend)
    std = torch.tensor(fast.specs[0].std).view(3, 1, 1) * 255  # back to gray levels
    image = _load_rgb_or_l(str(jpeg))
    for seed in range(4):
        torch.manual_seed(seed)
        expected = ref(image)
        torch.manual_seed(seed)
        got = fast(jpeg)
        assert [v.shape for v in got] == [v.shape for v in expected]
        for a, b in zip(got, expected, strict=True):
            diff = ((a - b).abs() * std)
            # the PIL path rounds to uint8 after every operation and shifts hue in 8-bit HSV
            assert diff.mean() < 3.0, diff.mean()
    torch.manual_seed(100)
    other = fast(jpeg)
    assert (((other[0] - got[0]).abs() * std).mean()) > 10, "another seed, other views"
    torch.manual_seed(3)
    assert all(torch.equal(a, b) for a, b in zip(fast(jpeg), got, strict=True)), "reproducible"


# ----------------------------------------------------------------------------- distributions
class _Recorder:
    """Patch torchvision's functional ops to record the parameters the PIL recipe applies (the
    operations themselves are skipped: the crop returns a 2 x 2 image, the rest return it)."""

    NAMES = ("resized_crop", "hflip", "adjust_brightness", "adjust_contrast",
             "adjust_saturation", "adjust_hue", "rgb_to_grayscale", "gaussian_blur", "solarize")

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, tuple]] = []
        for name in self.NAMES:
            original = getattr(F_v1, name)
            monkeypatch.setattr(F_v1, name, self._wrap(name, original))

    def _wrap(self, name: str, original):
        tiny = Image.new("RGB", (2, 2))

        def wrapper(img, *args, **kwargs):
            self.calls.append((name, args))
            return tiny if name == "resized_crop" else img
        return wrapper

    def take(self) -> list[tuple[str, tuple]]:
        calls, self.calls = self.calls, []
        return calls


def _reference_params(calls: list[tuple[str, tuple]]) -> np.ndarray:
    """A parameter vector (``PARAM_FIELDS``) from the recorded calls of one view."""
    p = np.array([0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 1, 2, 3, 0, 0, 0, 0], dtype=np.float64)
    order = []
    ops = {"adjust_brightness": 0, "adjust_contrast": 1, "adjust_saturation": 2, "adjust_hue": 3}
    for name, args in calls:
        if name == "resized_crop":
            p[0:4] = args[:4]
        elif name == "hflip":
            p[FIELD["flip"]] = 1
        elif name in ops:
            p[FIELD["jitter"]] = 1
            p[FIELD["brightness"] + ops[name]] = args[0]
            order.append(ops[name])
        elif name == "rgb_to_grayscale":
            p[FIELD["gray"]] = 1
        elif name == "gaussian_blur":
            p[FIELD["blur"]], p[FIELD["sigma"]] = 1, args[1][0]
        elif name == "solarize":
            p[FIELD["solarize"]] = 1
    if order:
        p[FIELD["order0"]: FIELD["order0"] + 4] = order
    return p


N_DRAWS = 3000
WIDTH, HEIGHT = 500, 375


@functools.cache
def _draws(recipe: str) -> tuple[list, list, list]:
    """(fast pipeline's parameters, reference parameters, specs) per view (SwAV: the first
    large and the first small crop), independent seeds."""
    ref_views = build_views(recipe, 16, 3)
    views = [0, 2] if recipe == "swav" else [0, 1]
    fast = FastViews(ref_views)
    torch.manual_seed(1)
    fast_p = [np.stack([draw_view_params(fast.specs[v], WIDTH, HEIGHT).numpy()
                        for _ in range(N_DRAWS)]) for v in views]
    image = Image.new("RGB", (WIDTH, HEIGHT), (120, 80, 200))
    torch.manual_seed(2)
    ref_p = []
    with pytest.MonkeyPatch.context() as monkeypatch:
        recorder = _Recorder(monkeypatch)
        for v in views:
            rows = []
            for _ in range(N_DRAWS):
                ref_views.transforms[v](image)
                rows.append(_reference_params(recorder.take()))
            ref_p.append(np.stack(rows))
    return fast_p, ref_p, [fast.specs[v] for v in views]


def _rate_z(a: np.ndarray, b: np.ndarray) -> float:
    """Two-proportion z statistic of two 0/1 samples."""
    p = (a.sum() + b.sum()) / (len(a) + len(b))
    se = math.sqrt(max(p * (1 - p), 1e-12) * (1 / len(a) + 1 / len(b)))
    return abs(a.mean() - b.mean()) / se


def _compare(fast: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """Per statistic: |z| for rates, KS p-values for continuous parameters."""
    out: dict[str, float] = {}
    area = lambda p: p[:, 2] * p[:, 3] / (WIDTH * HEIGHT)  # noqa: E731
    aspect = lambda p: np.log(p[:, 3] / p[:, 2])  # noqa: E731
    out["scale_ks_p"] = stats.ks_2samp(area(fast), area(ref)).pvalue
    out["aspect_ks_p"] = stats.ks_2samp(aspect(fast), aspect(ref)).pvalue
    for name in ("flip", "jitter", "gray", "blur", "solarize"):
        out[f"{name}_z"] = _rate_z(fast[:, FIELD[name]], ref[:, FIELD[name]])
    fj, rj = fast[:, FIELD["jitter"]] > 0, ref[:, FIELD["jitter"]] > 0
    if fj.any():
        for name in ("brightness", "contrast", "saturation", "hue"):
            out[f"{name}_ks_p"] = stats.ks_2samp(fast[fj, FIELD[name]],
                                                 ref[rj, FIELD[name]]).pvalue
        for op in range(4):  # each operation first in a quarter of the jittered views
            out[f"first_op{op}_z"] = _rate_z(fast[fj, FIELD["order0"]] == op,
                                             ref[rj, FIELD["order0"]] == op)
    fb, rb = fast[:, FIELD["blur"]] > 0, ref[:, FIELD["blur"]] > 0
    if fb.any():
        out["sigma_ks_p"] = stats.ks_2samp(fast[fb, FIELD["sigma"]], ref[rb, FIELD["sigma"]]).pvalue
    return out


def _assert_same(result: dict[str, float]) -> None:
    for key, value in result.items():
        if key.endswith("_z"):
            assert value < 4.5, (key, value)
        else:
            assert value > 1e-4, (key, value)


# Nominal rates of the official recipes, per view: flip, jitter, gray, blur, solarize.
NOMINAL = {"vicreg": [(0.5, 0.8, 0.2, 1.0, 0.0), (0.5, 0.8, 0.2, 0.1, 0.2)],
           "swav": [(0.5, 0.8, 0.2, 0.5, 0.0)] * 2,
           "simsiam": [(0.5, 0.8, 0.2, 0.5, 0.0)] * 2}
RANGES = {"vicreg": (0.08, 1.0, (0.6, 1.4), (0.8, 1.2), 0.1),
          "swav": (0.14, 1.0, (0.2, 1.8), (0.2, 1.8), 0.2),
          "simsiam": (0.2, 1.0, (0.6, 1.4), (0.6, 1.4), 0.1)}


@pytest.mark.parametrize("recipe", ["vicreg", "swav", "simsiam"])
def test_parameter_distributions_match_the_official_recipe(recipe: str) -> None:
    fast_p, ref_p, specs = _draws(recipe)
    for view, (fast, ref) in enumerate(zip(fast_p, ref_p, strict=True)):
        _assert_same(_compare(fast, ref))
        # and the nominal values of the paper's recipes, within sampling error
        for name, p in zip(("flip", "jitter", "gray", "blur", "solarize"),
                           NOMINAL[recipe][view], strict=True):
            rate = fast[:, FIELD[name]].mean()
            assert abs(rate - p) <= 4.5 * math.sqrt(p * (1 - p) / N_DRAWS) + 1e-12, (name, rate)
        lo, hi, bright, sat, hue = RANGES[recipe]
        if recipe == "swav" and view == 1:  # a small crop
            lo, hi = 0.05, 0.14
        scale = fast[:, 2] * fast[:, 3] / (WIDTH * HEIGHT)
        assert scale.min() >= lo - 0.01 and scale.max() <= hi + 0.01
        assert np.quantile(scale, 0.01) < lo + 0.05 * (hi - lo)
        ratio = fast[:, 3] / fast[:, 2]
        assert ratio.min() > 0.74 and ratio.max() < 1.35
        jit = fast[:, FIELD["jitter"]] > 0
        for name, (a, b) in (("brightness", bright), ("saturation", sat),
                             ("hue", (-hue, hue))):
            values = fast[jit, FIELD[name]]
            assert values.min() >= a and values.max() <= b
            assert values.min() < a + 0.02 * (b - a) and values.max() > b - 0.02 * (b - a)
        blur = fast[:, FIELD["blur"]] > 0
        if blur.any():
            assert 0.1 <= fast[blur, FIELD["sigma"]].min() < 0.15
            assert 1.95 < fast[blur, FIELD["sigma"]].max() <= 2.0
    assert specs[0].blur_kernel == 3  # 16 px views here (23 at 224 px)


def test_the_distribution_test_detects_a_changed_recipe() -> None:
    """Power check: blur p 0.4 instead of 0.5, or crop scale from 0.3 instead of 0.2, fail."""
    from torchvision import transforms as T

    _, ref_p, _ = _draws("simsiam")
    changed = build_views("simsiam", 16, 3)
    for t in changed.transforms[0].transforms:
        if isinstance(t, T.RandomApply) and isinstance(t.transforms[0], T.GaussianBlur):
            t.p = 0.4
        if isinstance(t, T.RandomResizedCrop):
            t.scale = (0.3, 1.0)
    spec = FastViews(changed).specs[0]
    torch.manual_seed(1)
    other = np.stack([draw_view_params(spec, WIDTH, HEIGHT).numpy() for _ in range(N_DRAWS)])
    result = _compare(other, ref_p[0])
    assert result["blur_z"] > 4.5 and result["scale_ks_p"] < 1e-6


# ----------------------------------------------------------------------------- output level
@pytest.mark.parametrize("backend", BACKENDS)
def test_flip_and_grayscale_rates_measured_on_the_output_images(tmp_path: Path,
                                                                 backend: str) -> None:
    """A horizontal luminance ramp (gray, so colour jitter keeps its direction): the sign of the
    output's left-right gradient gives the flip; equal channels give the grayscale step."""
    ramp = np.tile(np.linspace(20, 235, 200, dtype=np.float32), (150, 1))
    colour = np.stack([ramp, ramp * 0.8 + 30, 255 - ramp * 0.5], axis=-1)  # luma rises
    path = tmp_path / "ramp.png"
    Image.fromarray(colour.clip(0, 255).astype(np.uint8)).save(path)
    views = build_views("simsiam", 24, 3)
    views.transforms = views.transforms[:1]
    fast = FastViews(views, backend=backend)
    std = torch.tensor(fast.specs[0].std).view(3, 1, 1)
    mean = torch.tensor(fast.specs[0].mean).view(3, 1, 1)
    torch.manual_seed(0)
    flips, grays, n = 0, 0, 600
    for _ in range(n):
        view = fast(path)[0] * std + mean
        luma = (0.299 * view[0] + 0.587 * view[1] + 0.114 * view[2])
        flips += int(luma[:, -4:].mean() < luma[:, :4].mean())
        grays += int(float((view[0] - view[1]).abs().max()) < 2e-3
                     and float((view[1] - view[2]).abs().max()) < 2e-3)
    sd = math.sqrt(0.25 / n)
    assert abs(flips / n - 0.5) < 4.5 * sd, flips / n
    assert abs(grays / n - 0.2) < 4.5 * math.sqrt(0.16 / n), grays / n


# ----------------------------------------------------------------------------- kernels
def test_batched_operations_match_torchvision_per_sample() -> None:
    torch.manual_seed(0)
    x = torch.rand(3, 3, 20, 26)
    x[0, :, :5] = 0.5  # gray pixels (zero chroma)
    factors = torch.tensor([0.3, 1.0, 1.7])
    hues = torch.tensor([-0.45, 0.0, 0.2])
    sigmas = torch.tensor([0.3, 1.1, 2.0])
    cases = [(P.adjust_brightness, TF.adjust_brightness, factors),
             (P.adjust_contrast, TF.adjust_contrast, factors),
             (P.adjust_saturation, TF.adjust_saturation, factors),
             (P.adjust_hue, TF.adjust_hue, hues)]
    for ours, theirs, params in cases:
        expected = torch.stack([theirs(x[b], float(params[b])) for b in range(3)])
        torch.testing.assert_close(ours(x, params), expected, atol=2e-6, rtol=0)
    expected = torch.stack([TF.gaussian_blur(x[b], [7, 7], [float(sigmas[b])] * 2)
                            for b in range(3)])
    torch.testing.assert_close(P.gaussian_blur(x, sigmas, 7), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(P.grayscale(x), TF.rgb_to_grayscale(x), atol=1e-6, rtol=0)
    on = torch.tensor([True, False, True])
    sol = P.solarize(x, 0.5, on)
    torch.testing.assert_close(sol[0], TF.solarize(x[0], 0.5))
    torch.testing.assert_close(sol[1], x[1])


@pytest.mark.skipif(not photometric_cv2.available(), reason="needs opencv-python-headless")
def test_opencv_operations_match_torchvision() -> None:
    torch.manual_seed(1)
    x = torch.rand(3, 24, 30)
    hwc = x.permute(1, 2, 0).contiguous().numpy()
    index = FIELD
    base = [0.0] * len(PARAM_FIELDS)
    base[FIELD["brightness"]: FIELD["hue"] + 1] = [1.0, 1.0, 1.0, 0.0]
    base[FIELD["order0"]: FIELD["order0"] + 4] = [0.0, 1.0, 2.0, 3.0]
    ranges = [(0.5, 1.5)] * 4
    checks = [("brightness", 1.3, TF.adjust_brightness), ("contrast", 0.6, TF.adjust_contrast),
              ("saturation", 1.6, TF.adjust_saturation), ("hue", -0.3, TF.adjust_hue),
              ("hue", 0.45, TF.adjust_hue)]
    for name, value, fn in checks:
        p = list(base)
        p[FIELD["jitter"]], p[FIELD[name]] = 1.0, value
        got = photometric_cv2.photometric_hwc(hwc.copy(), p, index, ranges, 7, 0.5)
        torch.testing.assert_close(torch.from_numpy(got).permute(2, 0, 1), fn(x, value),
                                   atol=2e-4, rtol=0, msg=name)
    p = list(base)
    p[FIELD["blur"]], p[FIELD["sigma"]] = 1.0, 1.3
    got = photometric_cv2.photometric_hwc(hwc.copy(), p, index, ranges, 7, 0.5)
    torch.testing.assert_close(torch.from_numpy(got).permute(2, 0, 1),
                               TF.gaussian_blur(x, [7, 7], [1.3, 1.3]), atol=1e-5, rtol=0)
    p = list(base)
    p[FIELD["gray"]], p[FIELD["solarize"]] = 1.0, 1.0
    flipped = np.ascontiguousarray(hwc[:, ::-1])  # the caller flips (FastViews: its final copy)
    got = photometric_cv2.photometric_hwc(flipped, p, index, ranges, 7, 0.5)
    expected = TF.solarize(TF.rgb_to_grayscale(TF.horizontal_flip(x), 3), 0.5)
    torch.testing.assert_close(torch.from_numpy(got).permute(2, 0, 1), expected,
                               atol=2e-3, rtol=0)


@pytest.mark.skipif(not photometric_cv2.available(), reason="needs opencv-python-headless")
def test_opencv_blur_keeps_every_pixel_within_the_tail_of_the_full_kernel() -> None:
    cv2, tail = photometric_cv2.cv2, photometric_cv2.BLUR_TAIL
    x = np.random.default_rng(0).random((40, 50, 3), dtype=np.float32)
    x[:, :25] = 0.0  # an edge: the worst case for dropped taps
    for sigma in (0.1, 0.5, 1.0, 1.7, 2.0):
        k = photometric_cv2.blur_size(sigma, 23)
        assert k % 2 == 1 and k <= 23
        weights = np.exp(-0.5 * (np.arange(-11, 12) / sigma) ** 2)
        weights /= weights.sum()
        dropped = weights[np.abs(np.arange(-11, 12)) > k // 2].sum()
        assert dropped <= tail
        if k > 1:  # the next smaller kernel would drop too much
            assert weights[np.abs(np.arange(-11, 12)) > k // 2 - 1].sum() > tail
        full = cv2.GaussianBlur(x, (23, 23), sigma, sigma, borderType=cv2.BORDER_REFLECT_101)
        short = x if k == 1 else cv2.GaussianBlur(x, (k, k), sigma, sigma,
                                                  borderType=cv2.BORDER_REFLECT_101)
        assert np.abs(full - short).max() <= 2 * tail  # one axis each, plus float rounding


# ----------------------------------------------------------------------------- decoding, modes
@pytest.mark.skipif(not photometric_cv2.available(), reason="needs OpenCV")
def test_opencv_decode_gives_the_pixels_of_pil_and_a_channels_last_resize(jpeg: Path) -> None:
    data = jpeg.read_bytes()
    with Image.open(jpeg) as img:
        pil = np.asarray(img.convert("RGB"))
    hwc = photometric_cv2.decode_rgb_hwc(data, pil.shape[1], pil.shape[0])
    assert hwc is not None and hwc.shape == pil.shape
    assert np.array_equal(hwc, pil)
    assert photometric_cv2.decode_rgb_hwc(data, pil.shape[1] + 1, pil.shape[0]) is None
    # the crop of the HWC-backed view resizes to the same uint8 pixels as a CHW copy
    view = torch.from_numpy(hwc).permute(2, 0, 1)[:, 10:90, 20:140]
    for interp in (TF.InterpolationMode.BILINEAR, TF.InterpolationMode.BICUBIC):
        fast = TF.resize(view, [64, 64], interpolation=interp, antialias=True)
        ref = TF.resize(view.contiguous(), [64, 64], interpolation=interp, antialias=True)
        assert torch.equal(fast, ref)


def test_reduced_scale_decoding_when_every_crop_allows_it(tmp_path: Path) -> None:
    path = tmp_path / "big.jpg"
    natural_image(np.random.default_rng(3), 1024, 768).save(path, "JPEG", quality=90)
    views = build_views("simsiam", 64, 3)
    fast, full = FastViews(views), FastViews(views, draft=False)
    img = Image.open(path)
    params = [draw_view_params(s, 1024, 768) for s in fast.specs]
    params[0][:4] = torch.tensor([0.0, 0.0, 700.0, 700.0])
    params[1][:4] = torch.tensor([100.0, 200.0, 300.0, 260.0])
    assert fast._reduction(params) == 4  # 260 / 4 >= 64, 260 / 8 < 64
    params[1][:4] = torch.tensor([100.0, 200.0, 100.0, 100.0])
    assert fast._reduction(params) == 1
    assert img.size == (1024, 768)
    std = torch.tensor(fast.specs[0].std).view(3, 1, 1) * 255
    diffs = []
    for seed in range(6):
        torch.manual_seed(seed)
        a = fast(path)
        torch.manual_seed(seed)
        b = full(path)
        diffs += [float(((x - y).abs() * std).mean()) for x, y in zip(a, b, strict=True)]
    assert max(diffs) < 4.0  # DCT scaling instead of part of the resize's antialiasing


@pytest.mark.parametrize("backend", BACKENDS)
def test_device_mode_gives_the_cpu_views(jpeg: Path, backend: str) -> None:
    cpu = FastViews(build_views("swav", 48, 3), draft=False, backend=backend)
    dev = FastViews(build_views("swav", 48, 3), mode="device", draft=False)
    torch.manual_seed(5)
    items = [cpu(jpeg) for _ in range(4)]
    torch.manual_seed(5)
    raw = [(dev(jpeg), 0) for _ in range(4)]
    crops, params = collate_device_views(raw)
    assert crops[0].dtype == torch.uint8 and crops[0].shape == (4, 3, 48, 48)
    assert crops[2].shape == (4, 3, 21, 21) and params[0].shape == (4, len(PARAM_FIELDS))
    out = DeviceAugment(dev)(crops, params)
    for v, batch in enumerate(out):
        expected = torch.stack([item[v] for item in items])
        assert float((batch - expected).abs().mean()) < 1e-3
        assert float((batch - expected).abs().max()) < 0.05  # OpenCV vs torch rounding


def test_grayscale_recipe_and_png_input(tmp_path: Path) -> None:
    path = tmp_path / "g.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (28, 28), dtype=np.uint8)).save(path)
    ref = build_views("swav", 28, 1)
    fast = FastViews(ref)
    torch.manual_seed(0)
    got = fast(path)
    assert [tuple(v.shape) for v in got] == [(1, 28, 28)] * 2 + [(1, 12, 12)] * 6
    torch.manual_seed(0)
    expected = ref(Image.open(path))
    diff = (got[0] - expected[0]).abs().mean() * 0.3530 * 255
    assert diff < 3.0
