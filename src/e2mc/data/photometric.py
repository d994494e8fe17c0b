"""Photometric augmentations (torchvision's ``ColorJitter``, ``RandomGrayscale``,
``GaussianBlur``, ``RandomSolarize`` and a flip, with torchvision's formulas) on float
``[B, C, H, W]`` batches in [0, 1] where each sample has its own parameters and jitter order
(torchvision draws one set per batch). The blur is separable (taps below ``1e-7`` of the mass
dropped); the hue shift rebuilds RGB from value, chroma and hue in closed form.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .views import PARAM_INDEX, ViewSpec

__all__ = ["GRAY_WEIGHTS", "adjust_brightness", "adjust_contrast", "adjust_hue",
           "adjust_saturation", "apply_photometric", "gaussian_blur", "gaussian_kernels",
           "grayscale", "normalize_levels", "solarize"]

GRAY_WEIGHTS = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale (ITU-R 601-2)
_TAP_CUTOFF = 1e-7


def _per_sample(value: torch.Tensor | float, x: torch.Tensor) -> torch.Tensor:
    """``value`` as a ``[B, 1, 1, 1]`` tensor on ``x``'s device."""
    v = torch.as_tensor(value, dtype=x.dtype, device=x.device)
    return v.reshape(-1, 1, 1, 1) if v.dim() else v.reshape(1, 1, 1, 1).expand(x.shape[0], 1, 1, 1)


def grayscale(x: torch.Tensor) -> torch.Tensor:
    """Luma of ``[B, 3, H, W]`` (``[B, 1, H, W]``), torchvision's weights; 1 channel: ``x``."""
    if x.shape[-3] == 1:
        return x
    r, g, b = x.unbind(-3)
    return (GRAY_WEIGHTS[0] * r + GRAY_WEIGHTS[1] * g + GRAY_WEIGHTS[2] * b).unsqueeze(-3)


def adjust_brightness(x: torch.Tensor, factor: torch.Tensor | float) -> torch.Tensor:
    """``clamp(x * factor)`` per sample."""
    return (x * _per_sample(factor, x)).clamp_(0, 1)


def adjust_contrast(x: torch.Tensor, factor: torch.Tensor | float) -> torch.Tensor:
    """Blend with the mean luma of each image (torchvision's contrast)."""
    f = _per_sample(factor, x)
    channel_means = x.mean(dim=(-2, -1), keepdim=True)  # the luma mean from the channel means
    mean = grayscale(channel_means) if x.shape[-3] == 3 else channel_means
    return torch.addcmul((1 - f) * mean, x, f).clamp_(0, 1)


def adjust_saturation(x: torch.Tensor, factor: torch.Tensor | float) -> torch.Tensor:
    """Blend with the luma image (torchvision's saturation); a no-op on one channel."""
    if x.shape[-3] == 1:
        return x
    f = _per_sample(factor, x)
    return torch.addcmul(grayscale(x).mul_(1 - f), x, f).clamp_(0, 1)


def adjust_hue(x: torch.Tensor, shift: torch.Tensor | float) -> torch.Tensor:
    """Rotate each RGB image's hue by ``shift`` turns (torchvision's, in closed form)."""
    if x.shape[-3] == 1:
        return x
    r, g, b = x.unbind(-3)
    maxc = x.amax(dim=-3)
    chroma = maxc - x.amin(dim=-3)
    # hue in sixths of a turn; red wins ties, then green (torchvision's rule)
    is_r = r == maxc
    is_g = (g == maxc) & ~is_r
    h6 = torch.where(is_r, g - b, torch.where(is_g, b - r + 2 * chroma, r - g + 4 * chroma))
    h6 = h6 / chroma.clamp(min=1e-12) + 6.0 * _per_sample(shift, x)[:, 0]
    h6 = torch.remainder(h6, 6.0).unsqueeze(-3)
    # channel n in (5, 3, 1): V - C * clamp(min(k, 4 - k), 0, 1), k = (n + h6) mod 6, in [1, 11):
    # the triangle min(k, 4 - k) = 2 - |k - 2| and its copy 6 to the right replace the modulo
    n = torch.tensor((5.0, 3.0, 1.0), dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    k = h6 + n
    weight = (2.0 - (k - 2.0).abs_()).clamp_(0, 1) + (2.0 - (k - 8.0).abs_()).clamp_(0, 1)
    return maxc.unsqueeze(-3) - chroma.unsqueeze(-3) * weight


def solarize(x: torch.Tensor, threshold: float, on: torch.Tensor | None = None) -> torch.Tensor:
    """Invert the pixels ``>= threshold`` (in [0, 1]) of the samples where ``on`` is true."""
    inverted = torch.where(x >= threshold, 1.0 - x, x)
    if on is None:
        return inverted
    return torch.where(on.reshape(-1, 1, 1, 1).to(x.device), inverted, x)


def gaussian_kernels(sigma: torch.Tensor, kernel_size: int) -> torch.Tensor:
    """``[B, kernel_size]`` normalised 1-D Gaussian kernels, torchvision's sampling grid."""
    half = (kernel_size - 1) * 0.5
    grid = torch.linspace(-half, half, kernel_size, dtype=torch.float64, device=sigma.device)
    pdf = torch.exp(-0.5 * (grid / sigma.to(torch.float64).reshape(-1, 1)) ** 2)
    return pdf / pdf.sum(dim=1, keepdim=True)


def gaussian_blur(x: torch.Tensor, sigma: torch.Tensor, kernel_size: int) -> torch.Tensor:
    """Blur each sample with its own ``sigma`` (torchvision's, reflect padding), separably."""
    if kernel_size % 2 != 1 or kernel_size < 1:
        raise ValueError(f"kernel_size must be odd and positive, got {kernel_size}")
    kernels = gaussian_kernels(sigma, kernel_size)
    half = kernel_size // 2
    # drop the outer taps that no sample needs (negligible weight), renormalise
    needed = (kernels > _TAP_CUTOFF).any(dim=0).nonzero()
    radius = int(max(half - int(needed.min()), 0)) if needed.numel() else 0
    kernels = kernels[:, half - radius: half + radius + 1]
    kernels = (kernels / kernels.sum(dim=1, keepdim=True)).to(x.dtype)
    if radius == 0:
        return x
    if radius >= min(x.shape[-2:]):  # image smaller than the kernel: torchvision's own op
        import torchvision.transforms.v2.functional as TF

        return torch.stack([TF.gaussian_blur(xi, [kernel_size, kernel_size], [float(s)] * 2)
                            for xi, s in zip(x, sigma, strict=True)])
    taps = kernels.t().reshape(kernels.shape[1], -1, 1, 1, 1)  # taps[j]: [B, 1, 1, 1]
    for dim, pad in ((-1, (radius, radius, 0, 0)), (-2, (0, 0, radius, radius))):
        padded, n = F.pad(x, pad, mode="reflect"), x.shape[dim]
        x = padded.narrow(dim, 0, n) * taps[0]
        for j in range(1, len(taps)):
            x.addcmul_(padded.narrow(dim, j, n), taps[j])
    return x


_JITTER_OPS = (adjust_brightness, adjust_contrast, adjust_saturation, adjust_hue)


def normalize_levels(levels: torch.Tensor, spec: ViewSpec, out: torch.Tensor | None = None
                     ) -> torch.Tensor:
    """``(levels / 255 - mean) / std`` of gray levels as float32, into ``out`` or new memory."""
    std = torch.tensor(spec.std, dtype=torch.float32, device=levels.device).view(1, -1, 1, 1)
    mean = torch.tensor(spec.mean, dtype=torch.float32, device=levels.device).view(1, -1, 1, 1)
    if out is None:
        out = torch.empty(levels.shape, dtype=torch.float32, device=levels.device)
    return out.copy_(levels).mul_(1.0 / (255.0 * std)).sub_(mean / std)


def apply_photometric(x: torch.Tensor, params: torch.Tensor, spec: ViewSpec) -> torch.Tensor:
    """Flip, jitter, grayscale, blur and solarize a float ``[B, C, S, S]`` batch in [0, 1] (sample
    ``b`` with ``params[b]``; ``x`` is overwritten) and return its gray levels ``round(255 x)``,
    the official pipeline's 8-bit images."""
    cpu = params.detach().to("cpu", torch.float32)
    dev = params.to(x.device)

    def on(name: str) -> list[bool]:
        return [v > 0.5 for v in cpu[:, PARAM_INDEX[name]].tolist()]

    x = _apply(x, on("flip"), lambda v: v.flip(-1))
    jitter = on("jitter")
    if any(jitter):
        factors = dev[:, PARAM_INDEX["brightness"]: PARAM_INDEX["hue"] + 1]
        order = cpu[:, PARAM_INDEX["order0"]: PARAM_INDEX["order0"] + 4].round().long().tolist()
        for pos in range(4):
            for op in range(4):
                if spec.jitter[op] is not None:
                    mask = [j and o[pos] == op for j, o in zip(jitter, order, strict=True)]
                    x = _apply(x, mask, _JITTER_OPS[op], factors[:, op])
    if spec.channels == 3:
        x = _apply(x, on("gray"), lambda v: grayscale(v).expand(-1, 3, -1, -1).contiguous())
    x = _apply(x, on("blur"), lambda v, s: gaussian_blur(v, s, spec.blur_kernel),
               dev[:, PARAM_INDEX["sigma"]])
    threshold = spec.solarize_threshold / 255.0
    x = _apply(x, on("solarize"), lambda v: solarize(v, threshold))
    return x.mul_(255.0).round_()


def _apply(x: torch.Tensor, mask: list[bool], fn: Any, arg: torch.Tensor | None = None
           ) -> torch.Tensor:
    """``fn`` (with the per-sample ``arg``) applied to the samples where ``mask`` is true."""
    if not any(mask):
        return x
    if all(mask):
        return fn(x) if arg is None else fn(x, arg)
    idx = torch.tensor([k for k, m in enumerate(mask) if m], device=x.device)
    x[idx] = fn(x[idx]) if arg is None else fn(x[idx], arg[idx])
    return x
