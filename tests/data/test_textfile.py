"""The vectorised UTF-8 check finds exactly the lines Python's own decoder rejects."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from daskhps.data.textfile import blank_lines, invalid_utf8, read_text_bytes

# Bytes around every boundary of Unicode Table 3-7, plus ASCII, tab and newline.
TRICKY = np.frombuffer(
    bytes.fromhex("41 09 0A 80 8F 90 9F A0 BF C0 C1 C2 DF E0 E1 EC ED EE EF F0 F1 F3 F4 F5 FF"),
    dtype=np.uint8,
)
TEXT = list("aZ\t\n\u00e9\u00df\u20ac\ud55c\U0001f600\u07ff\u0800\uffff\U00010000\U0010ffff")


def _bad_lines(data: bytes) -> set[int]:
    b = np.frombuffer(data, dtype=np.uint8)
    newlines = np.flatnonzero(b == 0x0A)
    return set(np.searchsorted(newlines, invalid_utf8(b), side="left").tolist())


def _python_bad_lines(data: bytes) -> set[int]:
    out = set()
    for i, line in enumerate(data.split(b"\n")):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            out.add(i)
    return out


def test_bad_lines_match_pythons_decoder_on_random_bytes() -> None:
    rng = np.random.default_rng(0)
    for trial in range(4000):
        n = int(rng.integers(1, 30))
        if trial % 2:
            data = bytes(rng.choice(TRICKY, n))
        else:  # valid text, with one byte overwritten every other time
            b = bytearray("".join(rng.choice(TEXT, n)).encode())
            if trial % 4 == 2:
                b[int(rng.integers(len(b)))] = int(rng.choice(TRICKY))
            data = bytes(b)
        assert _bad_lines(data) == _python_bad_lines(data), data


def test_valid_utf8_and_ascii_have_no_bad_positions() -> None:
    text = "".join(TEXT * 50).encode()
    assert len(invalid_utf8(np.frombuffer(text, np.uint8))) == 0
    assert len(invalid_utf8(np.frombuffer(b"plain\tascii\n" * 100, np.uint8))) == 0


@pytest.mark.parametrize("cut", [b"\xe2\x82", b"\xf0\x9f\x98", b"\xc3"])
def test_a_sequence_cut_by_the_end_of_the_data_is_bad(cut: bytes) -> None:
    assert _bad_lines(b"ok\nstill ok\n" + cut) == {2}


def test_bad_lines_come_back_as_ascii_with_their_numbers(tmp_path: Path) -> None:
    p = tmp_path / "x.tsv"
    p.write_bytes("a\u00e9\n".encode() + b"b\xff\xfe\n" + "c\u20ac\n".encode() + b"\xc3d\n")
    text = read_text_bytes(str(p))
    assert text.undecodable.tolist() == [2, 4] and text.truncated is None
    assert text.data.to_pybytes() == "a\u00e9\nb??\nc\u20ac\n?d\n".encode()


def test_blank_lines_are_empty_or_a_lone_carriage_return() -> None:
    data = pa.py_buffer(b"\na\tb\n\r\n\t\n\n\r\nlast")
    assert blank_lines(data).tolist() == [1, 3, 5, 6]
