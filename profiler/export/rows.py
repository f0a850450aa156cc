"""Many small records of the same shape, encoded with numpy instead of one Python call per record.

A million-op trace is a million records that differ only in a few numbers. Both exporters build
them as byte matrices, one row per record, filled column block by column block:

- `decimal_block`: integers as right-aligned ASCII decimals, padded with spaces. JSON allows
  whitespace between tokens, so a padded number is still valid JSON and every row of a chunk has
  the same width: the Chrome writer needs no per-event string formatting at all.
- `varint_block`: integers as protobuf varints, with each row's length; `packed` keeps the first
  `length` bytes of every block of every row (one boolean-mask gather), for the Perfetto writer.
"""
from __future__ import annotations

import numpy as np

SPACE, ZERO, DOT, MINUS = ord(" "), ord("0"), ord("."), ord("-")


def _literal_t(n: int, text: bytes) -> np.ndarray:
    return np.repeat(np.frombuffer(text, dtype=np.uint8)[:, None], n, axis=1)


def decimal_block(x: np.ndarray, frac: int = 0) -> np.ndarray:
    """int64 values -> ASCII, right-aligned, space-padded, TRANSPOSED: (width, n), one row per character
    position (numpy writes whole contiguous rows; one transpose at the end is cheaper than strided
    columns). `frac` digits go after a decimal point: 1234567 with frac=3 is '1234.567', exactly."""
    x = np.asarray(x, dtype=np.int64)
    n = len(x)
    neg = x < 0
    has_neg = bool(neg.any())
    rest = np.where(neg, -x, x) if has_neg else x
    top = int(rest.max()) if n else 0
    min_digits = frac + 1 if frac else 1
    w = max(min_digits, len(str(top)))
    total = w + (1 if frac else 0) + (1 if has_neg else 0)
    out = np.empty((total, n), dtype=np.uint8)
    j = total - 1
    for k in range(w):
        q = rest // 10
        d = (rest - q * 10).astype(np.uint8)
        d += ZERO
        if k >= min_digits:
            d[rest == 0] = SPACE                 # a leading zero: pad instead
        out[j] = d
        j -= 1
        if frac and k == frac - 1:
            out[j] = DOT
            j -= 1
        rest = q
    if has_neg:
        out[0] = SPACE
        cols = np.flatnonzero(neg)
        first = (out[:, cols] != SPACE).argmax(axis=0)       # the first digit of each negative number
        out[first - 1, cols] = MINUS
    return out


def fixed_rows(n: int, pieces: list) -> np.ndarray:
    """Rows of equal width from pieces: bytes (a literal) or (literal, int64 values, frac, null_mask).

    A valued piece is printed as literal + number; where null_mask is True the whole piece (literal
    included, so it should start with ',') becomes spaces. Returns an (n, width) uint8 matrix.
    """
    blocks = []
    for p in pieces:
        if isinstance(p, bytes):
            blocks.append(_literal_t(n, p))
            continue
        lit, values, frac, null = p
        block = np.concatenate([_literal_t(n, lit), decimal_block(values, frac)], axis=0)
        if null is not None and null.any():
            block[:, null] = SPACE
        blocks.append(block)
    if not blocks:
        return np.zeros((n, 0), np.uint8)
    return np.ascontiguousarray(np.concatenate(blocks, axis=0).T)


def row_parts(prefixes: list[bytes], rows: np.ndarray) -> list[bytes]:
    """[prefix[0], row 0, prefix[1], row 1, ...] as bytes: the ragged part from Python, the rest as rows.

    A list, for `file.writelines`: copying the parts into the file's buffer is cheaper than joining
    them into one new string first (hundreds of MB of fresh memory for a big trace)."""
    n, w = rows.shape
    if n == 0:
        return []
    tails = rows.view(f"S{w}").ravel().tolist() if w else [b""] * n    # rows never end in NUL bytes
    parts = [b""] * (2 * n)
    parts[0::2] = prefixes
    parts[1::2] = tails
    return parts


# --- protobuf varints --------------------------------------------------------------------------------
def varint_len(x: np.ndarray) -> np.ndarray:
    u = np.asarray(x).astype(np.int64).view(np.uint64)      # int64 negatives: ten bytes, as protobuf does
    n = np.ones(len(u), dtype=np.int64)
    for k in range(1, 10):
        n += u >= np.uint64(1 << (7 * k))
    return n


def varint_block(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """-> (w, n) bytes TRANSPOSED (row k = byte k of every varint), lengths: value i is block[:lengths[i], i]."""
    u = np.asarray(x).astype(np.int64).view(np.uint64)
    ln = varint_len(u.view(np.int64))
    w = int(ln.max()) if len(ln) else 1
    out = np.empty((w, len(u)), dtype=np.uint8)
    for k in range(w):
        byte = ((u >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
        byte[k < ln - 1] |= 0x80
        out[k] = byte
    return out, ln


def const_block(text: bytes, n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.repeat(np.frombuffer(text, np.uint8)[:, None], n, axis=1), np.full(n, len(text), np.int64)


def packed(blocks: list[tuple[np.ndarray, np.ndarray]]) -> bytes:
    """Concatenate, value by value, the first lengths[i] bytes of each TRANSPOSED (block, lengths) pair."""
    if not blocks:
        return b""
    data = np.concatenate([b for b, _ in blocks], axis=0)
    keep = np.empty(data.shape, dtype=bool)
    row = 0
    for b, ln in blocks:
        w = b.shape[0]
        np.less(np.arange(w)[:, None], np.asarray(ln)[None, :], out=keep[row:row + w])
        row += w
    return data.T[keep.T].tobytes()


def table_block(rows: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """A small table of byte strings, TRANSPOSED: (longest, len(rows)) and lengths. Pick per value with
    (block[:, which], lengths[which]) for `packed`."""
    w = max((len(r) for r in rows), default=0) or 1
    table = np.zeros((w, max(len(rows), 1)), dtype=np.uint8)
    lens = np.zeros(max(len(rows), 1), dtype=np.int64)
    for i, r in enumerate(rows):
        table[:len(r), i] = np.frombuffer(r, dtype=np.uint8)
        lens[i] = len(r)
    return table, lens
