"""Row widths of keys from several tables, and the packing of such rows into a flat buffer.

In a run with several tables a key carries its table's index in bits 56..62
(``key >> TABLE_SHIFT``, :mod:`daskhps.data.keyspace`), and each table has its own row
width. The exchange pads every row to the widest table (``float[n, widest]``, zero beyond
a key's width) so the model and the tables see one layout, but sends only each key's first
``width`` floats::

    keys      [a0 b1 c0]          widths (table 0: 3, table 1: 1)   [3 1 3]
    rows      [a a a | b 0 0 | c c c]  --pack-->  [a a a b c c c]  --unpack-->  rows

Both sides of a transfer know the keys it carries (the owner its ``owned``, the requester its
``keys``), so each derives the floats per peer from them: no extra collective.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from numbers import Integral

import torch

from daskhps.data.keyspace import MAX_TABLES, TABLE_SHIFT
from daskhps.errors import ConfigError, DataError

__all__ = ["KeyWidths", "columns", "pack_rows", "split_floats", "unpack_rows"]


@dataclass(frozen=True)
class KeyWidths:
    """The row width of each table index; ``of(keys)`` is the width of every key.

    ``dims[t]`` is the width of the rows of table ``t`` (its keys are ``(t << 56) | low``).
    """

    dims: Sequence[int]
    widest: int = field(init=False)
    uniform: bool = field(init=False)  # every table as wide as the widest: nothing to pack
    _by_device: dict[torch.device, torch.Tensor] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        dims = tuple(self.dims)
        if not 1 <= len(dims) <= MAX_TABLES:
            raise ConfigError(
                f"KeyWidths: {len(dims)} tables; a run has 1 to {MAX_TABLES} tables "
                "(the table index lives in key bits 56..62)"
            )
        for t, d in enumerate(dims):
            if isinstance(d, bool) or not isinstance(d, Integral) or d < 1:
                raise ConfigError(
                    f"KeyWidths: table {t} has row width {d!r}; every width must be an "
                    "integer >= 1 (the sparse dim plus its optimizer state)"
                )
        dims = tuple(int(d) for d in dims)
        object.__setattr__(self, "dims", dims)
        object.__setattr__(self, "widest", max(dims))
        object.__setattr__(self, "uniform", min(dims) == max(dims))

    def of(self, keys: torch.Tensor) -> torch.Tensor:
        """``int64`` width of every key (same shape), from its table index ``key >> 56``."""
        tags = keys >> TABLE_SHIFT
        if tags.numel():
            lo, hi = (int(v) for v in torch.aminmax(tags))
            if lo < 0 or hi >= len(self.dims):
                flat = keys.reshape(-1)
                key = int(flat[((flat < 0) | (flat >> TABLE_SHIFT >= len(self.dims)))][0])
                raise DataError(
                    f"key {key} has table index {key >> TABLE_SHIFT} (key >> "
                    f"{TABLE_SHIFT}) but widths are known for tables 0..{len(self.dims) - 1}: "
                    "encode keys as (table << 56) | low with a table of the run"
                )
        return self._lookup(keys.device)[tags]

    def mask(self, keys: torch.Tensor) -> torch.Tensor:
        """Boolean ``[len(keys), widest]``: the columns each key's row uses."""
        return columns(self.of(keys), self.widest)

    def _lookup(self, device: torch.device) -> torch.Tensor:
        # One small table per device, so a CUDA exchange does not copy it at every call.
        table = self._by_device.get(device)
        if table is None:
            table = torch.tensor(self.dims, dtype=torch.int64, device=device)
            self._by_device[device] = table
        return table


def columns(widths: torch.Tensor, widest: int) -> torch.Tensor:
    """Boolean ``[len(widths), widest]``: ``True`` in the first ``widths[i]`` columns of row i."""
    return torch.arange(widest, device=widths.device) < widths[:, None]


def pack_rows(rows: torch.Tensor, widths: torch.Tensor) -> torch.Tensor:
    """The first ``widths[i]`` floats of every row ``i`` of ``rows`` (``[n, widest]``), one
    row after the other in a flat tensor."""
    # masked_select, not rows[mask]: the same floats without listing their indices first
    # (several times faster on CPU).
    return torch.masked_select(rows, columns(widths, rows.shape[1]))


def unpack_rows(flat: torch.Tensor, widths: torch.Tensor, widest: int) -> torch.Tensor:
    """Inverse of :func:`pack_rows`: ``[len(widths), widest]``, zero beyond each row's width."""
    out = flat.new_zeros((len(widths), widest))
    return out.masked_scatter_(columns(widths, widest), flat)


def split_floats(widths: torch.Tensor, counts: Sequence[int]) -> list[int]:
    """Floats in each consecutive group of ``counts[j]`` rows (``sum(counts) == len(widths)``):
    the split sizes of a packed all-to-all, from one cumulative sum."""
    ends = torch.zeros(len(counts) + 1, dtype=torch.int64, device=widths.device)
    ends[1:] = torch.tensor(counts, dtype=torch.int64).cumsum(0)
    total = torch.zeros(len(widths) + 1, dtype=torch.int64, device=widths.device)
    torch.cumsum(widths, 0, out=total[1:])
    return total[ends].diff().tolist()
