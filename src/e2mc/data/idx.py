"""Reading and writing IDX files (the MNIST / Fashion-MNIST format), gzip-compressed or not."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np

__all__ = ["load_idx", "save_idx"]

# IDX type code (third byte of the magic number) -> big-endian numpy dtype.
_IDX_DTYPES: dict[int, str] = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4",
                               0x0E: ">f8"}
_GZIP_MAGIC = b"\x1f\x8b"


def _read_bytes(path: Path) -> bytes:
    """A file's bytes, gunzipped (every member) when they start with the gzip magic."""
    raw = path.read_bytes()
    if not raw.startswith(_GZIP_MAGIC):
        return raw
    try:
        return gzip.decompress(raw)
    except (EOFError, OSError, zlib.error) as err:
        raise ValueError(f"{path}: corrupt or truncated gzip stream ({err})") from err


def load_idx(path: str | Path) -> np.ndarray:
    """An IDX file (``.gz`` or not) as a native-byte-order numpy array; ``ValueError`` naming the
    file for a bad magic number or type, or a size not matching the header."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"IDX file not found: {path}")
    data = _read_bytes(path)
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ValueError(f"{path}: not an IDX file (magic number {data[:4].hex() or 'missing'}, "
                         "expected 0000<type><ndim>, e.g. 00000803 for images, 00000801 for "
                         "labels)")
    type_code, ndim = data[2], data[3]
    if type_code not in _IDX_DTYPES:
        raise ValueError(f"{path}: unknown IDX data type code 0x{type_code:02x}")
    if ndim == 0:
        raise ValueError(f"{path}: IDX header declares 0 dimensions")
    header_len = 4 + 4 * ndim
    if len(data) < header_len:
        raise ValueError(f"{path}: truncated IDX header ({len(data)} bytes)")
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_IDX_DTYPES[type_code])
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    got = len(data) - header_len
    if got != expected:
        kind = "truncated" if got < expected else "has trailing bytes"
        raise ValueError(f"{path}: IDX file {kind}: header shape {shape} needs {expected} data "
                         f"bytes, found {got}")
    array = np.frombuffer(data, dtype=dtype, offset=header_len).reshape(shape)
    return array.astype(dtype.newbyteorder("="), copy=True)


def save_idx(array: np.ndarray, path: str | Path, compress: bool | None = None) -> None:
    """Write ``array`` as an IDX file; gzip it when ``compress`` (default: path ends in .gz)."""
    path = Path(path)
    array = np.asarray(array)
    codes = {np.dtype(v).newbyteorder("="): k for k, v in _IDX_DTYPES.items()}
    native = array.dtype.newbyteorder("=")
    if native not in codes:
        raise ValueError(f"dtype {array.dtype} cannot be stored in IDX")
    if array.ndim == 0 or array.ndim > 255:
        raise ValueError(f"IDX needs 1 to 255 dimensions, got {array.ndim}")
    header = bytes([0, 0, codes[native], array.ndim])
    header += b"".join(int(s).to_bytes(4, "big") for s in array.shape)
    payload = header + array.astype(_IDX_DTYPES[codes[native]], copy=False).tobytes()
    if compress is None:
        compress = path.suffix == ".gz"
    from e2mc.files import atomic_write

    data = gzip.compress(payload, mtime=0) if compress else payload
    atomic_write(path, lambda f: f.write(data))
