"""Fixed-length wire layouts for reports: big-endian unsigned fields and bit masks.

Every report of a given oracle encodes to the same number of bytes (it travels
inside a fixed-size anonymous packet, DESIGN.md §5), and every byte string of
that length decodes to exactly one report array, or is flagged non-canonical.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from anonml.mechanisms._errors import InvalidReport


def bytes_for(max_value: int) -> int:
    """The number of bytes of a big-endian unsigned field holding 0..max_value."""
    return max(1, (int(max_value).bit_length() + 7) // 8)


def pack_fields(columns: np.ndarray, widths: Sequence[int]) -> np.ndarray:
    """Encode an (n, k) array of non-negative integers, column j into widths[j]
    big-endian bytes; returns an (n, sum(widths)) uint8 array."""
    n = columns.shape[0]
    out = np.empty((n, sum(widths)), dtype=np.uint8)
    offset = 0
    for j, width in enumerate(widths):
        column = columns[:, j].astype(np.uint64)
        for k in range(width):
            shift = np.uint64(8 * (width - 1 - k))
            out[:, offset + k] = ((column >> shift) & np.uint64(0xFF)).astype(np.uint8)
        offset += width
    return out


def unpack_fields(raw: np.ndarray, widths: Sequence[int]) -> np.ndarray:
    """Inverse of ``pack_fields``: an (n, sum(widths)) uint8 array to (n, k) int64.

    Fields are at most 8 bytes; callers check ranges (a field may decode to a
    value no honest peer sends), so values >= 2**63 are returned as -1 to be
    rejected rather than wrapped.
    """
    n = raw.shape[0]
    out = np.empty((n, len(widths)), dtype=np.int64)
    offset = 0
    for j, width in enumerate(widths):
        value = np.zeros(n, dtype=np.uint64)
        for k in range(width):
            value = (value << np.uint64(8)) | raw[:, offset + k].astype(np.uint64)
        too_big = value >= np.uint64(1 << 63)
        out[:, j] = np.where(too_big, np.uint64(0), value).astype(np.int64)
        out[too_big, j] = -1
        offset += width
    return out


def pack_bits(bits: np.ndarray) -> np.ndarray:
    """An (n, m) 0/1 array to (n, ceil(m/8)) bytes, first value in the top bit,
    padding bits zero."""
    return np.packbits(bits.astype(np.uint8, copy=False), axis=1)


def unpack_bits(raw: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of ``pack_bits``: returns the (n, m) uint8 bits and a boolean mask
    of rows whose padding bits are not all zero (non-canonical encodings)."""
    all_bits = np.unpackbits(raw, axis=1)
    bad_padding = np.asarray(all_bits[:, m:].any(axis=1), dtype=bool)
    return all_bits[:, :m], bad_padding


def check_blobs(blobs: Sequence[bytes]) -> None:
    """Raise ``InvalidReport`` unless ``blobs`` is a sequence (not a byte string itself)."""
    if isinstance(blobs, (bytes, bytearray, memoryview, str)) or not isinstance(blobs, Sequence):
        raise InvalidReport(f"reports must be a sequence of byte strings, got {type(blobs).__name__!r}")


def join_blobs(blobs: Sequence[bytes], report_bytes: int, offset: int = 0) -> np.ndarray:
    """Check that ``blobs`` is a sequence of byte strings of exactly
    ``report_bytes`` bytes each and return them as an (n, report_bytes) uint8
    array. Raises ``InvalidReport`` for anything else, naming a report by its
    index plus ``offset`` (its place in the whole batch when this is a block)."""
    check_blobs(blobs)
    for index, blob in enumerate(blobs, start=offset):
        if not isinstance(blob, (bytes, bytearray)):
            raise InvalidReport(f"report {index} is not bytes: {type(blob).__name__!r}")
        if len(blob) != report_bytes:
            raise InvalidReport(f"report {index} has {len(blob)!r} bytes, expected {report_bytes}")
    joined = b"".join(bytes(blob) for blob in blobs)
    return np.frombuffer(joined, dtype=np.uint8).reshape(len(blobs), report_bytes)
