"""The Hugging Face hub, reached once or not at all: :func:`cache_if_offline` probes the endpoint
with a short timeout and, when nothing answers, runs the block in offline mode (a cached file
loads, a missing one fails at once instead of ``huggingface_hub``'s minute of retries).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

#: Seconds the endpoint has to answer before the hub counts as unreachable.
PROBE_TIMEOUT = 5.0


def unreachable(timeout: float = PROBE_TIMEOUT) -> str | None:
    """Why the hub cannot be reached; None when it answers or ``huggingface_hub`` is absent."""
    try:
        from huggingface_hub import constants
        from huggingface_hub.utils import get_session
    except ImportError:
        return None
    if constants.is_offline_mode():
        return "HF_HUB_OFFLINE is set"
    try:
        get_session().head(constants.ENDPOINT, timeout=timeout, follow_redirects=False)
    except Exception as err:  # noqa: BLE001 (httpx / OSError: what matters is that it failed)
        reason = " ".join(str(err).split()) or "no answer"
        return f"{constants.ENDPOINT} did not answer ({type(err).__name__}: {reason})"
    return None


@contextlib.contextmanager
def cache_if_offline(timeout: float = PROBE_TIMEOUT) -> Iterator[str | None]:
    """Run the block offline when the hub is unreachable; yields the reason (else None)."""
    reason = unreachable(timeout)
    if reason is None:
        yield None
        return
    from huggingface_hub import constants

    saved = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield reason
    finally:
        constants.HF_HUB_OFFLINE = saved
