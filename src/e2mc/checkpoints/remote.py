"""Checkpoints by URL (http, https, file), downloaded once into torch.hub's ``checkpoints``
cache under a key of the whole URL, checked against a full ``sha256`` (argument or
``#sha256=<hex>`` fragment) or torch.hub's hash prefix in the file name (docs/checkpoints.md)."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from urllib.error import HTTPError
from urllib.parse import unquote, urlsplit

from e2mc.files import sha256_file

SCHEMES = ("http", "https", "file")
_HASH_IN_NAME = re.compile(r"-([a-f0-9]+)\.")  # torch.hub's convention
_HEX = re.compile(r"[0-9a-fA-F]{64}")


def is_url(ref: object) -> bool:
    """Whether ``ref`` is a string URL this module can fetch (http, https, file)."""
    return isinstance(ref, str) and urlsplit(ref).scheme.lower() in SCHEMES \
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
