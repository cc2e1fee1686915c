"""A vectorised open-addressing hash map from int64 keys to int64 values, in torch tensors.

Layout: buckets of four ``(key, value)`` pairs, one 64-byte row per bucket, so a lookup gathers
one cache line per key and finds both the key and its value in it::

    table  int64[buckets + pad, 8]    k0 v0 k1 v1 k2 v2 k3 v3     (one bucket per row)
    spill  int32[buckets + pad]       keys that passed this bucket on the way to a later one

A key's home bucket is the top bits of a splitmix64-style mix of the key (top bits, so the
index is independent of owner routing, which uses the low bits of a mix). A full home bucket
spills to the next one (linear probing over buckets, no wrap-around: ``pad`` spare buckets at
the end, and the table grows if they ever fill). ``spill`` counts the keys that probed past a
bucket; a lookup stops at the first bucket whose count is zero, so deletes clear their slot at
once instead of leaving tombstones.

Every operation works on whole key batches: one round per bucket of probing (rarely more than
one or two), each vectorised over all pending keys. Batch keys that claim one free slot are
resolved by writing them all and keeping the key that reads back. An empty slot holds
``INT64_MIN``; a real key of that value lives beside the table.

Lookups reuse scratch buffers (fresh large tensors each call would cost page faults), so one
index must not be used from two threads at once; callers serialise access.
"""

from __future__ import annotations

import math

import torch

from daskhps._mix64 import fmix64_torch_, s64

__all__ = ["KeyIndex"]

_EMPTY = -(2**63)
_PAIRS = 4  # key/value pairs per bucket: one 64-byte cache line
_PAD = 16  # spare buckets after the last home bucket
_WINDOW = 4  # buckets searched per round once a key is not in its home bucket
PROBE_CHUNK = 1 << 19  # keys probed at once; larger batches go in chunks
MIN_SCRATCH = 1024  # scratch buffers are never smaller (reused across small batches)
MIN_CAPACITY = 1024  # the smallest index a store opens with
_SEED = 0x2545F4914F6CDD1D  # makes the mix differ from the one used for owner routing


# A bool[P] row with exactly one True, viewed as one P-byte integer, is 1 << 8c; times _COLS its
# top log2(P) bits are c. Finds the column of a match without a reduction over the row.
_WORD = {4: torch.int32, 8: torch.int64}[_PAIRS]
_TOP = _PAIRS.bit_length() - 1
_COLS = s64(sum(c << (8 * _PAIRS - _TOP - 8 * c) for c in range(_PAIRS)))


def _home(
    keys: torch.Tensor,
    buckets: int,
    out: torch.Tensor | None = None,
    tmp: torch.Tensor | None = None,
) -> torch.Tensor:
    """Home bucket in ``[0, buckets)``: top bits of splitmix64's finaliser of ``key ^ seed``.

    The finaliser's last xor-shift only changes low bits, so it is skipped. ``out`` and ``tmp``
    are optional buffers shaped like ``keys``.
    """
    z = torch.bitwise_xor(keys, _SEED, out=out) if out is not None else keys ^ _SEED
    z = fmix64_torch_(z, final=False, tmp=tmp)
    # Top 32 bits times the bucket count, over 2**32: any bucket count, no modulo.
    z = z.bitwise_right_shift_(32).bitwise_and_((1 << 32) - 1).mul_(buckets)
    return z.bitwise_right_shift_(32)


def _column(onehot: torch.Tensor) -> torch.Tensor:
    """Column of the single True in each row of a contiguous ``bool[n, _PAIRS]``."""
    c = onehot.view(_WORD).view(-1) * _COLS
    return c.bitwise_right_shift_(8 * _PAIRS - _TOP).bitwise_and_(_PAIRS - 1)


def _buckets_for(capacity: int, load_factor: float) -> int:
    return max(2, math.ceil(capacity / (_PAIRS * load_factor)))


class KeyIndex:
    """Map from arbitrary int64 keys to int64 values, vectorised over key batches.

    Parameters
    ----------
    capacity:
        Keys to hold without growing; the table holds ``capacity / load_factor`` slots (rounded
        up to whole buckets).
    device:
        Where every tensor lives; keys and values passed in must be there too.
    load_factor:
        Most occupied slots per slot before the table grows.
    most:
        Keys the index will ever hold (a tier's capacity), if known: growing never sizes the
        table past what they need (doubling from a small start would overshoot it by up to
        2x), so a full index takes :meth:`nbytes_for` ``most``, as capacity plans price it.
    """

    def __init__(
        self,
        capacity: int,
        *,
        device: torch.device | str = "cpu",
        load_factor: float = 0.5,
        most: int | None = None,
    ):
        if capacity < 0:
            raise ValueError(f"KeyIndex capacity must be >= 0, got {capacity}")
        if not 0.0 < load_factor <= 0.9:
            raise ValueError(f"KeyIndex load_factor must be in (0, 0.9], got {load_factor}")
        self.device = torch.device(device)
        self.load_factor = load_factor
        self._most = most
        self._len = 0
        self._special: int | None = None  # value of the key equal to the empty marker
        self._step_cache = torch.empty(0, dtype=torch.int64, device=self.device)
        self._buffers: dict[str, torch.Tensor] = {}
        self._alloc(_buckets_for(capacity, load_factor))

    @staticmethod
    def nbytes_for(capacity: int, load_factor: float = 0.5) -> int:
        """Bytes an index sized for ``capacity`` keys occupies (what :attr:`nbytes` reports)."""
        rows = _buckets_for(capacity, load_factor) + _PAD
        return rows * (2 * _PAIRS * 8 + 4)

    def _alloc(self, buckets: int) -> None:
        self._buckets = buckets
        rows = buckets + _PAD
        self._table = torch.empty(rows, 2 * _PAIRS, dtype=torch.int64, device=self.device)
        self._table[:, 0::2] = _EMPTY
        self._spill = torch.zeros(rows, dtype=torch.int32, device=self.device)
        self._flat = self._table.view(-1)

    # -- sizes ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._len

    @property
    def slots(self) -> int:
        """Slots keys can hash to (the load factor's denominator)."""
        return self._buckets * _PAIRS

    @property
    def load(self) -> float:
        """Occupied slots / :attr:`slots`."""
        return self._len / self.slots

    @property
    def nbytes(self) -> int:
        """Bytes of the table, excluding :attr:`scratch_bytes`."""
        return self._table.nbytes + self._spill.nbytes

    @property
    def scratch_bytes(self) -> int:
        """Bytes of the buffers reused across lookups (grow with the batch, up to a chunk)."""
        return sum(b.nbytes for b in self._buffers.values()) + self._step_cache.nbytes

    # -- probing -------------------------------------------------------------------------------

    def _scratch(
        self, name: str, n: int, *shape: int, dtype: torch.dtype = torch.int64
    ) -> torch.Tensor:
        """A reused buffer of ``n`` rows: fresh large allocations each call cost page faults."""
        buf = self._buffers.get(name)
        if buf is None or buf.shape[0] < n:
            buf = torch.empty(max(n, MIN_SCRATCH), *shape, dtype=dtype, device=self.device)
            self._buffers[name] = buf
        return buf[:n]

    def _find(
        self, keys: torch.Tensor, values: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(where, found, home)`` of each key; garbage in ``where`` where not found.

        ``where`` is the key's value if ``values`` else its flat pair index in the table. With
        ``values``, ``home`` is a scratch buffer that the next call overwrites.
        """
        n = keys.numel()
        if n > PROBE_CHUNK:  # bounds the scratch buffers (about 100 bytes per key)
            parts = [self._find(part, values) for part in keys.split(PROBE_CHUNK)]
            return tuple(torch.cat([p[i] for p in parts]) for i in range(3))  # type: ignore[return-value]
        home = self._scratch("home", n) if values else None
        home = _home(keys, self._buckets, out=home, tmp=self._scratch("tmp", n))
        rows = torch.index_select(self._table, 0, home, out=self._scratch("rows", n, 2 * _PAIRS))
        hit = torch.eq(
            rows[:, 0::2], keys[:, None], out=self._scratch("hit", n, _PAIRS, dtype=torch.bool)
        )
        word = hit.view(_WORD).view(-1)
        found = word != 0
        # Top bits of word * _COLS give the column; one shift less gives twice the column.
        twice = torch.mul(word, _COLS, out=self._scratch("twice", n, dtype=_WORD))
        twice = twice.bitwise_right_shift_(8 * _PAIRS - _TOP - 1).bitwise_and_(2 * _PAIRS - 2)
        if values:  # read values from the gathered rows: sequential, unlike the table
            pos = torch.add(self._steps(n), twice, out=self._scratch("tmp", n))
            where = torch.index_select(rows.view(-1), 0, pos)
        else:
            where = twice.to(torch.int64, copy=True).bitwise_right_shift_(1)
            where = where.add_(home, alpha=_PAIRS)
        todo = (~found).nonzero().squeeze(1)  # a few percent at load 0.5: rarely none
        if todo.numel():
            self._find_spilled(keys, home, todo, found, where, values)
        return where, found, home

    def _steps(self, n: int) -> torch.Tensor:
        """``[1, 2P + 1, 4P + 1, ...]``: where the first value of each gathered row sits."""
        if self._step_cache.numel() < n:
            self._step_cache = torch.arange(
                1, 2 * _PAIRS * max(n, MIN_SCRATCH) + 1, 2 * _PAIRS, device=self.device
            )
        return self._step_cache[:n]

    def _find_spilled(
        self,
        keys: torch.Tensor,
        home: torch.Tensor,
        todo: torch.Tensor,
        found: torch.Tensor,
        where: torch.Tensor,
        values: bool,
    ) -> None:
        """Follow spill chains for keys missing from their home bucket, a window at a time.

        Such keys are few (a few percent at load 0.5), so each round gathers the next
        ``_WINDOW`` buckets as one contiguous slice of the table per key.
        """
        windows = self._windows()
        start = home[todo]  # the window starts after this bucket
        while True:
            go = (self._spill[start] > 0).nonzero().squeeze(1)  # someone probed past it
            if go.numel() < todo.numel():
                todo, start = todo[go], start[go]
            if not todo.numel():
                return
            start = start.add_(1).clamp_(max=windows.shape[0] - 1)
            rows = torch.index_select(windows, 0, start)  # [q, W * 2P]
            hit = (rows[:, 0::2] == keys[todo][:, None]).to(torch.uint8)
            got, pos = hit.max(1)  # found, and the pair within the window
            got = got.bool()
            if values:
                hit = rows.gather(1, pos[:, None].mul_(2).add_(1)).squeeze(1)
            else:
                hit = pos.add_(start, alpha=_PAIRS)
            idx = got.nonzero().squeeze(1)
            where[todo[idx]] = hit[idx]
            found[todo[idx]] = True
            miss = (~got).nonzero().squeeze(1)
            todo, start = todo[miss], start[miss] + (_WINDOW - 1)

    def _mask_special(self, keys: torch.Tensor, found: torch.Tensor) -> torch.Tensor | None:
        """Correct ``found`` for keys equal to the empty marker; return their mask if any."""
        if not keys.numel() or int(keys.min()) != _EMPTY:  # one pass; the marker is the min
            return None
        special = keys == _EMPTY
        found.masked_fill_(special, self._special is not None)
        return special

    def get(self, keys: torch.Tensor, *, default: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
        """Values of ``keys`` (``default`` where missing) and the found mask."""
        values, found, _ = self._find(keys, values=True)
        special = self._mask_special(keys, found)
        values = torch.where(found, values, default)
        if special is not None and self._special is not None:
            values.masked_fill_(special, self._special)
        return values, found

    # -- updates -------------------------------------------------------------------------------

    def put(self, keys: torch.Tensor, values: torch.Tensor, *, absent: bool = False) -> None:
        """Insert or overwrite; ``keys`` must be unique. Grows past the load factor.

        ``absent`` promises that no key is present yet, which skips looking them up.
        """
        if keys.numel() > PROBE_CHUNK:
            # As lookups do: the insert's scratch (windows of buckets per pending key, a few
            # hundred bytes a key) would otherwise scale with the batch; opening a store puts
            # its whole snapshot at once, and the freed scratch stayed in the process.
            if keys.numel() + self._len > self.load_factor * self.slots:
                self._rebuild(self._len + keys.numel())  # once, not once per chunk
            for k, v in zip(keys.split(PROBE_CHUNK), values.split(PROBE_CHUNK), strict=True):
                self.put(k, v, absent=absent)
            return
        special = keys == _EMPTY
        if bool(special.any()):
            self._len += self._special is None
            self._special = int(values[special][0])
            keys, values = keys[~special], values[~special]
        home = None
        if not absent:
            slot, found, home = self._find(keys)
            old = found.nonzero().squeeze(1)
            if old.numel():
                self._flat[slot[old] * 2 + 1] = values[old]
            new = (~found).nonzero().squeeze(1)
            if new.numel() < keys.numel():
                keys, values, home = keys[new], values[new], home[new]
        if not keys.numel():
            return
        if self._len + keys.numel() > self.load_factor * self.slots:
            self._rebuild(self._len + keys.numel())
            home = None  # homes move with the table size
        self._insert(keys, values, home)

    def _windows(self) -> torch.Tensor:
        """Overlapping view: row ``b`` is buckets ``b .. b + _WINDOW - 1`` of the table."""
        rows = self._table.shape[0] - _WINDOW + 1
        return self._flat.as_strided((rows, 2 * _PAIRS * _WINDOW), (2 * _PAIRS, 1))

    def _insert(self, keys: torch.Tensor, values: torch.Tensor, home: torch.Tensor | None) -> None:
        """Place keys known to be absent, each in the first bucket from its home with room.

        A round looks at a window of buckets per pending key. Keys aiming at one bucket pick
        different free slots where they can; those that still collide retry next round.
        """
        if home is None:
            home = _home(keys, self._buckets)
        windows = self._windows()
        start = home.clone()
        todo = torch.arange(keys.numel(), device=self.device)
        while todo.numel():
            if int(start.max()) >= windows.shape[0]:
                self._rebuild(self._len + todo.numel())  # spare buckets ran out
                self._insert(keys[todo], values[todo], None)
                return
            free = torch.index_select(windows, 0, start)[:, 0::2] == _EMPTY  # [q, W * P]
            nfree = free.view(-1, _WINDOW, _PAIRS).sum(2)  # per bucket of the window
            room, first = (nfree > 0).to(torch.uint8).max(1)  # first bucket with room
            has = room.bool()
            # Spread keys over that bucket's free slots to cut down on collisions.
            n_first = nfree.gather(1, first[:, None]).clamp_(min=1)
            rank = (todo[:, None] % n_first).add_(1)
            mine = free.view(-1, _WINDOW, _PAIRS)[torch.arange(todo.numel()), first]
            pick = mine & (mine.cumsum(1) == rank)
            bucket = start + first
            slot = _column(pick).to(torch.int64).add_(bucket, alpha=_PAIRS)
            aim = has.nonzero().squeeze(1)
            k = keys[todo[aim]]
            self._flat[slot[aim] * 2] = k
            won = aim[self._flat[slot[aim] * 2] == k]
            self._flat[slot[won] * 2 + 1] = values[todo[won]]
            self._add_spill(home[todo[won]], bucket[won], 1)
            self._len += won.numel()
            start = torch.where(has, bucket, start + _WINDOW)  # losers retry from their pick
            keep = torch.ones_like(todo, dtype=torch.bool)
            keep[won] = False
            todo, start = todo[keep], start[keep]

    def _add_spill(self, home: torch.Tensor, bucket: torch.Tensor, step: int) -> None:
        """Add ``step`` to the spill count of every bucket from ``home`` up to ``bucket``."""
        dist = bucket - home
        far = (dist > 0).nonzero().squeeze(1)
        if not far.numel():
            return
        home, dist = home[far], dist[far]
        steps = torch.arange(int(dist.max()), device=self.device)
        passed = home[:, None] + steps
        one = torch.tensor(step, dtype=torch.int32, device=self.device)
        self._spill.index_put_((passed[steps < dist[:, None]],), one, accumulate=True)

    def delete(self, keys: torch.Tensor) -> torch.Tensor:
        """Remove ``keys``; returns which were present."""
        slot, found, home = self._find(keys)
        special = self._mask_special(keys, found)
        if special is not None and self._special is not None:
            self._special = None
            self._len -= 1
        regular = found if special is None else found & ~special
        idx = regular.nonzero().squeeze(1)
        if idx.numel():
            s = slot[idx]
            self._flat[s * 2] = _EMPTY
            self._add_spill(home[idx], s // _PAIRS, -1)
            self._len -= idx.numel()
        return found

    def _rebuild(self, need: int) -> None:
        keys, values = self._items_table()
        if need <= self.load_factor * self.slots:
            buckets = 2 * self._buckets  # ran out of spare buckets at the end: spread keys wider
        else:
            # Geometric growth: sizing to exactly `need` would rebuild on every small insert.
            buckets = max(2 * self._buckets, _buckets_for(need, self.load_factor))
            if self._most is not None:
                buckets = min(buckets, _buckets_for(max(self._most, need), self.load_factor))
        self._alloc(buckets)
        self._len = 1 if self._special is not None else 0
        # In chunks: an insert's temporaries (the window of buckets each pending key looks
        # at, and its masks) are about 400 bytes a key, several times the table itself.
        for k, v in zip(keys.split(PROBE_CHUNK), values.split(PROBE_CHUNK), strict=True):
            self._insert(k, v, None)

    # -- bulk ----------------------------------------------------------------------------------

    def _items_table(self) -> tuple[torch.Tensor, torch.Tensor]:
        keys = self._table[:, 0::2]
        used = keys != _EMPTY
        return keys[used], self._table[:, 1::2][used]

    def items(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All ``(keys, values)``, in no particular order."""
        keys, values = self._items_table()
        if self._special is not None:
            keys = torch.cat([keys, keys.new_full((1,), _EMPTY)])
            values = torch.cat([values, values.new_full((1,), self._special)])
        return keys, values

    def clear(self) -> None:
        """Remove every key; keeps the allocated size."""
        self._table[:, 0::2] = _EMPTY
        self._spill.zero_()
        self._len = 0
        self._special = None
