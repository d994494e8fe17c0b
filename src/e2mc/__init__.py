"""e2mc: improve pre-trained self-supervised embeddings by effective entropy maximization.

Implements "Improving Pre-trained Self-Supervised Embeddings Through Effective Entropy
Maximization" (AISTATS 2025). The criterion itself lives in :mod:`e2mc.criterion` (torch only);
:class:`e2mc.E2MC` is the add-on module to drop into a training loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:  # pragma: no cover
    from e2mc.addons import E2MC

__all__ = ["E2MC", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy, so that `import e2mc` (and `e2mc --version`) stays cheap.
    if name == "E2MC":
        from e2mc.addons import E2MC

        return E2MC
    raise AttributeError(f"module 'e2mc' has no attribute {name!r}")
