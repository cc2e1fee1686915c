"""Pool the rows of multi-hot bags into one row per (example, field), before the model."""

from __future__ import annotations

from typing import Literal

import torch

from daskhps.errors import ConfigError, DataError

__all__ = ["pool"]

POOL_MODES = ("sum", "mean")


def pool(
    rows: torch.Tensor,
    offsets: torch.Tensor,
    mode: Literal["sum", "mean"] = "sum",
    *,
    check: bool = True,
) -> torch.Tensor:
    """Reduce CSR bags of rows to one row per bag.

    Bag ``i`` is ``rows[offsets[i]:offsets[i + 1]]``. Bags are example-major, so with ``B``
    examples and ``F`` fields bag ``i`` is field ``i % F`` of example ``i // F`` and the result
    reshapes for free into the model's ``sparse`` input with ``.view(B, F, D)``::

        example    0                     1
        field      f0     f1     f2      f0     f1           f2
        bag i      0      1      2       3      4            5
        rows       r0 r1  r2     -       r3     r4 r5 r6     r7
        offsets    0      2      3       3      4            7      8    (B*F + 1 entries)
        pooled     p0     p1     0       p3     p4           p5          float32[B*F, D]
                                                                         -> .view(B, F, D)

    Bag 2 is empty (``offsets[2] == offsets[3]``) and pools to zeros. Note the order differs from
    torchrec's ``KeyedJaggedTensor``, which is field-major.

    Differentiable in ``rows``: the gradient of a row is the gradient of its bag (divided by the
    bag length for ``"mean"``), which is what the table's sparse optimizer needs.

    Parameters
    ----------
    rows:
        ``float[N, D]``, the looked-up rows of every key of the batch in bag order.
    offsets:
        ``int64[num_bags + 1]``, non-decreasing, ``offsets[0] == 0`` and ``offsets[-1] == N``.
    mode:
        ``"sum"`` or ``"mean"``. Empty bags give zeros in both modes (as ``embedding_bag``).
    check:
        Validate ``offsets``. Costs a device synchronisation on GPU; the training loop may turn
        it off once its batches are known good.

    Returns
    -------
    torch.Tensor
        ``float[num_bags, D]`` on the device of ``rows``.
    """
    if mode not in POOL_MODES:
        raise ConfigError(f"pool mode {mode!r} is not one of {list(POOL_MODES)}")
    if rows.dim() != 2:
        raise DataError(f"pool: rows must be 2-d [N, D], got shape {tuple(rows.shape)}")
    if offsets.dim() != 1 or offsets.dtype != torch.int64 or offsets.numel() < 1:
        raise DataError(
            "pool: offsets must be a 1-d int64 tensor of num_bags + 1 entries, "
            f"got dtype {offsets.dtype} and shape {tuple(offsets.shape)}"
        )
    lengths = offsets.diff()
    if check:
        n = rows.shape[0]
        first, last = int(offsets[0]), int(offsets[-1])
        if first != 0 or last != n:
            raise DataError(
                f"pool: offsets must start at 0 and end at len(rows) = {n}, got {first} .. {last}"
            )
        if bool((lengths < 0).any()):
            raise DataError("pool: offsets must be non-decreasing (a bag cannot have length < 0)")
    # segment_reduce walks the contiguous CSR segments in order: deterministic on CPU, and on the
    # 2-core reference machine several times faster in backward than index_add_ with a bag id.
    out = torch.segment_reduce(rows, "sum", lengths=lengths, unsafe=True, initial=0.0)
    if mode == "mean":
        # Empty bags sum to 0; dividing by 1 keeps them 0 instead of 0 / 0 = nan.
        out = out / lengths.clamp(min=1).to(out.dtype).unsqueeze(1)
    return out
