"""What a checkpoint argument stands for (:func:`load_file`: a file, a run directory, a loaded
object, a URL). URLs (http, https, file) are downloaded once into torch.hub's ``checkpoints``
cache under a key of the whole URL, checked against a full ``sha256`` (argument or
``#sha256=<hex>`` fragment) or torch.hub's hash prefix in the file name (docs/checkpoints.md)."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any
from urllib.error import HTTPError
from urllib.parse import unquote, urlsplit

from e2mc.checkpoints.io import torch_load
from e2mc.files import sha256_file

_HASH_IN_NAME = re.compile(r"-([a-f0-9]+)\.")  # torch.hub's convention
_HEX = re.compile(r"[0-9a-fA-F]{64}")


def is_url(ref: object) -> bool:
    """Whether ``ref`` is a string URL this module can fetch (http, https, file)."""
    return isinstance(ref, str) and urlsplit(ref).scheme.lower() in ("http", "https", "file") \
        and "://" in ref


def split_hash(url: str) -> tuple[str, str | None]:
    """``("https://x/f.pth", "ab12...")`` from ``"https://x/f.pth#sha256=ab12..."``."""
    base, sep, fragment = url.partition("#")
    if not sep:
        return url, None
    if not fragment.startswith("sha256="):
        raise ValueError(f"{url}: the only URL fragment understood is #sha256=<64 hex digits>")
    return base, fragment[len("sha256="):]


def cache_path(url: str, sha256: str | None = None) -> Path:
    """Where :func:`fetch` keeps ``url``: its file name prefixed by a key of the whole URL and
    ``sha256``, so that ``file:///A/x.pt`` and ``file:///B/x.pt`` are two entries."""
    import torch.hub

    url, from_fragment = split_hash(url)
    name = os.path.basename(unquote(urlsplit(url).path))
    if not name:
        raise ValueError(f"{url}: the URL names no file")
    expected = (sha256 or from_fragment or "").lower()
    key = hashlib.sha256(f"{url}#sha256={expected}".encode()).hexdigest()[:16]
    return Path(torch.hub.get_dir()) / "checkpoints" / f"{key}-{name}"


def fetch(url: str, sha256: str | None = None, check_hash: bool = False,
          progress: bool = True) -> Path:
    """The local copy of ``url``, downloaded into the cache unless there. A ``sha256`` (or
    ``#sha256=``) mismatch, a digest not starting with the file name's hex prefix
    (``check_hash``) or an unreachable URL is a ``ValueError``; a bad download is not kept."""
    import torch.hub

    url, from_fragment = split_hash(url)
    if sha256 and from_fragment and sha256.lower() != from_fragment.lower():
        raise ValueError(f"{url}: two different sha256 values given")
    sha256 = sha256 or from_fragment
    if sha256 is not None and not _HEX.fullmatch(sha256):
        raise ValueError(f"sha256 must be 64 hex digits, got {sha256!r}")
    prefix = None
    if check_hash:
        match = _HASH_IN_NAME.search(os.path.basename(urlsplit(url).path))
        if match is None:
            raise ValueError(f"{url}: check_hash needs a file name with a hash prefix "
                             "(name-<hex>.ext); give the full sha256 instead")
        prefix = match.group(1)
    expected = (sha256 or prefix or "").lower() or None
    dst = cache_path(url, sha256)
    if not dst.is_file():
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            torch.hub.download_url_to_file(url, str(dst), hash_prefix=expected,
                                           progress=progress)
        except RuntimeError as err:  # torch.hub's hash mismatch (the partial file is removed)
            raise ValueError(f"{url}: {err}") from None
        except HTTPError as err:
            raise ValueError(f"cannot download {url}: HTTP {err.code} {err.reason}") from None
        except OSError as err:  # URLError (no server, missing file:// target), disk errors
            raise ValueError(f"cannot download {url}: {getattr(err, 'reason', err)}") from None
    elif expected is not None:
        actual = sha256_file(dst)
        if not actual.startswith(expected):
            raise ValueError(f"{dst} (cached copy of {url}) has sha256 {actual}, expected "
                             f"{expected}: delete the file to download it again")
    return dst


PathOrState = str | os.PathLike[str] | dict[str, Any]


def load_file(path_or_state: PathOrState, trust: bool) -> tuple[Any, str | None, str | None]:
    """``(object, source, local file read)`` (None, None for a loaded object); a URL is fetched
    first, a run directory stands for its model (:func:`checkpoint_of`)."""
    if isinstance(path_or_state, dict):
        return path_or_state, None, None
    local = local_checkpoint(path_or_state)
    source = str(path_or_state) if is_url(path_or_state) else local
    return torch_load(local, trust=trust), source, local


def checkpoint_of(path_or_run_dir: str | os.PathLike[str], last: bool = False) -> str:
    """``path_or_run_dir`` itself, or a run directory's model (:func:`e2mc.artifacts.run_model`:
    its kept ``best.pt``, else or with ``last`` its latest checkpoint)."""
    from e2mc.artifacts import run_model

    model = None if is_url(path_or_run_dir) else run_model(path_or_run_dir, last)
    if model is None or model.path == Path(path_or_run_dir):  # a URL, or the file itself
        return os.fspath(path_or_run_dir)
    return str(model.path)


def local_checkpoint(ref: str | os.PathLike[str], last: bool = False) -> str:
    """The local file ``ref`` stands for: a URL's fetched copy, a run directory's model, else
    ``ref`` itself."""
    return str(fetch(str(ref))) if is_url(ref) else checkpoint_of(ref, last)
