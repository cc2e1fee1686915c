"""The bytes of a text click-log file, ready for Arrow's CSV reader.

Arrow's reader drops a whole file for one value that is not UTF-8 (``invalid UTF8 data``), and
a line with the wrong number of fields *and* such bytes breaks its invalid-row callback (a
``UnicodeDecodeError`` traceback, the raw bytes on the terminal, then ``Expected 40 columns,
got 1`` for the file). A truncated ``.gz`` file fails as a whole too. So the file is read into
memory first::

    file (.gz: decompressed as far as the data goes; a truncated file is noted, not fatal)
      -> cut after the last complete line when the file ends early
      -> lines that are not UTF-8: their line numbers, and their non-ASCII bytes set to '?'
      -> Arrow buffer for pyarrow.csv.read_csv

The parser then drops those lines as bad rows (reason ``undecodable``) and counts the
truncation (``truncated_file``). The UTF-8 check is vectorised (numpy) and looks only at the
non-ASCII bytes: a file that is all ASCII, the usual case, costs one comparison per byte.
"""

from __future__ import annotations

import contextlib
import zlib
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa

from daskhps.storage import filesystem, is_url, open_input

__all__ = [
    "TextBytes",
    "blank_lines",
    "decode_text",
    "invalid_utf8",
    "line_start",
    "lines_before",
    "read_text_bytes",
    "splittable",
]

_CHUNK = 1 << 20  # compressed bytes read at a time
_NEWLINE = 0x0A
_QUESTION = 0x3F


@dataclass(frozen=True)
class TextBytes:
    """A text file's bytes: ``undecodable`` holds the 1-based numbers of the lines that were
    not UTF-8 (now ASCII: each byte >= 0x80 of them is ``?``); ``truncated`` says why the data
    ends early (None when the file is whole)."""

    data: pa.Buffer
    undecodable: np.ndarray
    truncated: str | None = None


def _gunzip(path: str) -> tuple[bytes, str | None]:
    """Decompress a gzip file (several members allowed) as far as its data goes.

    Returns the bytes and, when the data ends early (a truncated file: a copy or download cut
    short), why, the bytes then ending after the last complete line. Damaged data (a failed
    check) raises OSError: any byte of it may be wrong, so none is kept.
    """
    out: list[bytes] = []
    d: zlib._Decompress | None = None
    fed = 0  # compressed bytes given to the current member
    with open_input(path) as f:
        while chunk := f.read(_CHUNK):
            while chunk:
                if d is None:
                    if not chunk.strip(b"\0"):  # zero padding after the last member
                        break
                    d, fed = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS), 0
                fed += len(chunk)
                try:
                    out.append(d.decompress(chunk))
                except zlib.error as e:
                    raise OSError(f"damaged gzip data ({e})") from None
                chunk = b""
                if d.eof:  # a member ended: what follows is the next member
                    chunk, d = d.unused_data, None
    data = b"".join(out)
    if d is None or not fed or d.eof:
        return data, None
    if not data:
        raise OSError("the gzip data ends before its first byte (the file is truncated)")
    return data[: data.rfind(b"\n") + 1], "the gzip data ends early (the file is truncated)"


def _raw_bytes(path: str) -> tuple[pa.Buffer, str | None]:
    if path.endswith(".gz"):
        data, problem = _gunzip(path)
        return pa.py_buffer(data), problem
    if not is_url(path):
        with pa.input_stream(path, compression="detect") as stream:  # plain, .bz2, .zst, ...
            return stream.read_buffer(), None
    with open_input(path) as f:  # an object: the codec its suffix names, as for a file
        codec = _codec(path)
        if codec is None:
            return pa.py_buffer(f.read()), None
        with pa.CompressedInputStream(pa.PythonFile(f, mode="r"), codec) as stream:
            return stream.read_buffer(), None


def _codec(path: str) -> str | None:
    try:
        return str(pa.Codec.detect(path).name)
    except (TypeError, ValueError, pa.ArrowException):  # not compressed
        return None


def invalid_utf8(b: np.ndarray) -> np.ndarray:
    """Sorted positions of non-ASCII bytes of the uint8 array ``b`` where its UTF-8 is broken.

    Every ill-formed sequence (Unicode Table 3-7: stray or missing continuation bytes,
    overlong forms, surrogates, values past U+10FFFF) flags at least one of its bytes; one
    that ends too early (before an ASCII byte, or the end of ``b``) flags its last byte. Only
    the non-ASCII bytes are looked at, so the cost follows how much of ``b`` is non-ASCII.
    """
    if not len(b) or b.max() < 0x80:  # plain ASCII, the usual log: one vectorised pass
        return np.zeros(0, np.intp)
    high = np.flatnonzero(b >= 0x80)
    padded = np.concatenate([np.zeros(3, np.uint8), b, np.zeros(1, np.uint8)])  # 0: ASCII
    at = high + 3  # positions in padded
    x, nxt = padded[at], padded[at + 1]
    p1, p2, p3 = padded[at - 1], padded[at - 2], padded[at - 3]

    def cont(v: np.ndarray) -> np.ndarray:
        return (v & 0xC0) == 0x80

    def lead(v: np.ndarray, first: int) -> np.ndarray:  # a lead byte of >= 2, 3 or 4 bytes
        return (v >= first) & (v <= 0xF4)

    # A continuation byte belongs at a position when a lead byte 1, 2 or 3 places back is
    # followed by continuation bytes up to it (so a sequence broken by a newline ends there).
    need_here = (
        lead(p1, 0xC2) | (cont(p1) & lead(p2, 0xE0)) | (cont(p1) & cont(p2) & lead(p3, 0xF0))
    )
    need_next = lead(x, 0xC2) | (cont(x) & lead(p1, 0xE0)) | (cont(x) & cont(p1) & lead(p2, 0xF0))
    wrong = (cont(x) != need_here) | (need_next & ~cont(nxt))
    wrong |= (x == 0xC0) | (x == 0xC1) | (x >= 0xF5)  # never in UTF-8
    wrong |= (x == 0xE0) & (nxt < 0xA0)  # overlong 3-byte form
    wrong |= (x == 0xED) & (nxt > 0x9F)  # a surrogate
    wrong |= (x == 0xF0) & (nxt < 0x90)  # overlong 4-byte form
    wrong |= (x == 0xF4) & (nxt > 0x8F)  # past U+10FFFF
    return high[wrong]


def splittable(path: str) -> bool:
    """Whether a text file can be read in byte ranges: plain text, not compressed."""
    return not path.endswith(_COMPRESSED)


_COMPRESSED = (".gz", ".bz2", ".zst", ".zstd", ".lz4", ".xz", ".br", ".snappy")


class _Reader(Protocol):
    """What :func:`_line_start` reads: a local file, or an object (:class:`_RangedObject`)."""

    def seek(self, pos: int, /) -> int: ...
    def read(self, n: int, /) -> bytes: ...


def _line_start(f: _Reader, at: int) -> int:
    """The offset of the first line that starts at or after byte ``at``."""
    if at == 0:
        return 0
    f.seek(at - 1)
    skipped = 0
    while chunk := f.read(_CHUNK):
        i = chunk.find(b"\n")
        if i >= 0:
            return at - 1 + skipped + i + 1
        skipped += len(chunk)
    return at - 1 + skipped  # no newline after it: the end of the file


def line_start(path: str, at: int) -> int:
    """The offset of the first line of ``path`` that starts at or after byte ``at``."""
    with open_input(path) as f:
        return _line_start(f, at)


class _RangedObject:
    """An object read as a file, through ranged reads of ``[base, ...)`` that start with
    ``[base, end)`` and grow only as far as the reads ask: a block costs its own bytes and a
    margin to its last line's end, not the read-ahead of a buffered file (which fetched each
    block's bytes about three times over). Reads start at or after ``base``."""

    def __init__(self, path: str, base: int, end: int) -> None:
        self.fs, self.key = filesystem(path)
        self.size = int(self.fs.size(self.key))
        self.base = self.pos = base
        self.data = bytearray()
        self._fetch(end)

    def _fetch(self, to: int) -> None:
        have = self.base + len(self.data)
        to = min(to, self.size)
        if to > have:
            self.data += self.fs.cat_file(self.key, start=have, end=to)

    def seek(self, pos: int) -> int:
        self.pos = pos
        return pos

    def read(self, n: int) -> bytes:
        stop = min(self.pos + n, self.size)
        self._fetch(stop)
        out = bytes(self.data[self.pos - self.base : stop - self.base])
        self.pos = max(stop, self.pos)
        return out


def _range_bytes(path: str, start: int, stop: int) -> pa.Buffer:
    """The lines of a plain text file that start in bytes ``[start, stop)``: a line belongs
    to the range its first byte is in, so consecutive ranges hold every line exactly once."""
    f: _Reader
    with contextlib.ExitStack() as stack:
        if is_url(path):  # one ranged read: the block and a margin for its last line's end
            f = _RangedObject(path, max(start - 1, 0), stop + _CHUNK)
        else:
            f = stack.enter_context(open_input(path))
        lo, hi = _line_start(f, start), _line_start(f, stop)
        f.seek(lo)
        return pa.py_buffer(f.read(max(hi - lo, 0)))


def lines_before(path: str, offset: int) -> int:
    """The number of lines before byte ``offset`` of a plain text file (line numbers of a
    range: only counted for a message, so the whole prefix is read only on that path)."""
    n = 0
    with open_input(path) as f:
        left = offset
        while left > 0 and (chunk := f.read(min(_CHUNK * 8, left))):
            n += chunk.count(b"\n")
            left -= len(chunk)
    return n


def read_text_bytes(path: str, byte_range: tuple[int, int] | None = None) -> TextBytes:
    """Read ``path`` (plain or compressed by its suffix) for the CSV reader; see the module
    docstring. ``byte_range`` ``(start, stop)`` reads only the lines that start in it (plain
    text only, see :func:`splittable`). Raises OSError (or an Arrow error) when the file
    cannot be read at all."""
    if byte_range is None:
        buf, truncated = _raw_bytes(path)
    else:
        if not splittable(path):
            raise ValueError(f"{path}: a compressed file cannot be read in byte ranges")
        buf, truncated = _range_bytes(path, *byte_range), None
    return decode_text(buf, truncated)


def decode_text(buf: pa.Buffer, truncated: str | None = None) -> TextBytes:
    """Text bytes from anywhere (a file, a request body) for the CSV reader: lines that are
    not UTF-8 are listed and made ASCII, as the module docstring says."""
    b = np.frombuffer(buf, dtype=np.uint8)
    bad = invalid_utf8(b)
    if not len(bad):  # the usual case: valid UTF-8, most often plain ASCII
        return TextBytes(buf, bad, truncated)
    newlines = np.flatnonzero(b == _NEWLINE)
    bad_lines = np.unique(np.searchsorted(newlines, bad, side="left"))  # 0-based
    # Make the bad lines ASCII so the reader keeps the rest of the file: every non-ASCII byte
    # of those lines becomes '?' (the lines are dropped as bad rows anyway).
    high = np.flatnonzero(b >= 0x80)
    mark = np.zeros(len(newlines) + 1, dtype=bool)
    mark[bad_lines] = True
    fixed = b.copy()
    fixed[high[mark[np.searchsorted(newlines, high, side="left")]]] = _QUESTION
    return TextBytes(pa.py_buffer(fixed), bad_lines + 1, truncated)


def blank_lines(data: pa.Buffer) -> np.ndarray:
    """1-based numbers of the empty lines (nothing, or a lone carriage return) of ``data``."""
    b = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(b == _NEWLINE)
    starts = np.concatenate([[0], ends + 1])[: len(ends)]
    width = ends - starts
    cr = np.zeros(len(ends), dtype=bool)
    one = width == 1
    cr[one] = b[starts[one]] == 0x0D
    return np.flatnonzero((width == 0) | cr) + 1
