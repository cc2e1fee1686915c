"""DCN-v2 (Wang et al., 2021): a cross network of full- or low-rank cross layers, and a deep MLP.

"DCN V2: Improved Deep & Cross Network and Practical Lessons for Web-scale Learning to Rank
Systems". The input is one vector per example, ``x0 = [e_1, ..., e_F, dense]`` of width
``d = F * D + num_dense`` (``d = sum_f D_f + num_dense`` for fields of unequal widths), and
each cross layer maps ``x_l`` to (the paper's Eq. 1)::

    x_{l+1} = x0 * (W_l x_l + b_l) + x_l          W_l: d x d, b_l: d, * elementwise

or, with ``low_rank = r``, ``W_l = U_l V_l^T`` (its low-rank form, Eq. 2; ``U_l, V_l: d x r``)::

    x_{l+1} = x0 * (U_l (V_l^T x_l) + b_l) + x_l

The paper's mixture of low-rank experts (DCN-Mix) is not implemented.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from daskhps.errors import ConfigError
from daskhps.models.base import CTRModel, InputLayout
from daskhps.models.layers import (
    MLP,
    Activation,
    Dropout,
    LayerSizes,
    OptionCheck,
    check_deep_mlp,
)

__all__ = [
    "STRUCTURES",
    "CrossLayer",
    "DCNv2",
    "check_cross_layers",
    "check_low_rank",
    "check_structure",
]

#: How the cross network and the deep MLP are combined (the paper's Figure 1).
STRUCTURES = ("stacked", "parallel")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_cross_layers(model: str, option: str, value: int) -> int:
    """Return ``value`` as a number of cross layers (``>= 1``), or raise :class:`ConfigError`."""
    if not _is_int(value) or value < 1:
        raise ConfigError(
            f"model {model!r}: option {option!r} must be an integer >= 1 (the number of cross "
            f"layers), got {value!r}"
        )
    return int(value)


def check_low_rank(model: str, option: str, value: int | None) -> int | None:
    """Return ``value`` as a rank (``>= 1``) or ``None`` (full rank), or raise ConfigError."""
    if value is not None and (not _is_int(value) or value < 1):
        raise ConfigError(
            f"model {model!r}: option {option!r} must be an integer >= 1 (the rank r of each "
            f"cross layer's U V^T), or null for full-rank cross layers, got {value!r}"
        )
    return value


def check_structure(model: str, option: str, value: str) -> str:
    """Return ``value`` if it is one of :data:`STRUCTURES`, or raise :class:`ConfigError`."""
    if not isinstance(value, str) or value not in STRUCTURES:
        raise ConfigError(
            f"model {model!r}: option {option!r} must be 'stacked' (the deep MLP on the cross "
            f"network's output) or 'parallel' (both on the input, outputs concatenated), "
            f"got {value!r}"
        )
    return value


# Option types: the annotation carries the check (see daskhps.models.layers.OptionCheck).
CrossLayers = Annotated[int, OptionCheck(check_cross_layers)]
LowRank = Annotated[int | None, OptionCheck(check_low_rank)]
Structure = Annotated[Literal["stacked", "parallel"], OptionCheck(check_structure)]


class CrossLayer(nn.Module):
    """One cross layer: ``forward(x0, x) = x0 * (W x + b) + x`` row by row, ``float[B, d]``.

    Full rank keeps ``weight`` (``W``, ``d x d``); ``low_rank = r`` keeps ``u`` and ``v``
    (``U`` and ``V``, both ``d x r``) and computes ``W x`` as ``U (V^T x)``: ``2 d r`` weights
    instead of ``d^2``, fewer when ``r < d / 2``. ``bias`` is ``b`` (``d``).

    Initialised as TorchRec's ``CrossNet`` and ``LowRankCrossNet`` are: Xavier-normal matrices,
    zero bias, so a layer starts near ``x0 * (W x) + x`` with ``W x`` of about ``x``'s scale.
    """

    def __init__(self, width: int, low_rank: int | None = None) -> None:
        super().__init__()
        self.width = width
        self.low_rank = low_rank
        self.weight: nn.Parameter | None = None
        self.u: nn.Parameter | None = None
        self.v: nn.Parameter | None = None
        if low_rank is None:
            self.weight = nn.Parameter(nn.init.xavier_normal_(torch.empty(width, width)))
        else:
            self.u = nn.Parameter(nn.init.xavier_normal_(torch.empty(width, low_rank)))
            self.v = nn.Parameter(nn.init.xavier_normal_(torch.empty(width, low_rank)))
        self.bias = nn.Parameter(torch.zeros(width))

    def forward(self, x0: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        # Rows are examples: (W x)^T = x^T W^T, which F.linear computes with the bias added.
        if self.weight is not None:
            wx = F.linear(x, self.weight, self.bias)
        else:
            assert self.u is not None and self.v is not None
            wx = F.linear(x @ self.v, self.u, self.bias)  # U (V^T x) + b, rank r in between
        return x0 * wx + x


class DCNv2(CTRModel):
    """Deep & Cross Network v2 over ``x0 = [e_1..e_F, dense]`` (``d = sum_f D_f + num_dense``).

    ``cross_layers`` cross layers (see :class:`CrossLayer`) map ``x0`` to ``x_L`` (width
    ``d``). ``structure="stacked"``: ``logit = w . MLP(x_L) + c``; ``"parallel"``:
    ``logit = w . [x_L, MLP(x0)] + c``. With ``deep_mlp=[]`` there is no deep part and both
    are ``w . x_L + c``, the cross network alone.

    Parameters
    ----------
    layout:
        Batch layout, see :class:`~daskhps.models.base.InputLayout`; fields of unequal widths
        need nothing more (``x0`` holds every field's columns side by side).
    cross_layers:
        Number of cross layers, at least 1; ``L`` layers give crosses up to degree ``L + 1``.
    low_rank:
        ``None``: full-rank ``W_l`` (``d^2`` weights a layer); ``r``: ``W_l = U_l V_l^T``
        (``2 d r`` weights a layer).
    structure:
        ``"stacked"`` or ``"parallel"``, see above.
    deep_mlp:
        Hidden widths of the deep MLP; the last linear layer (to 1 logit) is appended after
        the combination.
    activation:
        Activation after each hidden layer of the deep MLP (the cross layers have none).
    dropout:
        Dropout after each hidden activation of the deep MLP; 0 for none.
    """

    name = "dcnv2"

    def __init__(
        self,
        layout: InputLayout,
        *,
        cross_layers: CrossLayers = 3,
        low_rank: LowRank = None,
        # Stacked by default: the cross network feeds the MLP, as in TorchRec's DLRM_DCN (the
        # MLPerf DLRM-DCNv2 reference: cross net, then the over arch) and NVIDIA Merlin's
        # DCNModel (stacked=True). The paper draws both structures (its Figure 1) and presents
        # neither as the default; FuxiCTR, behind the BARS benchmarks, defaults to parallel,
        # which is one option away.
        structure: Structure = "stacked",
        deep_mlp: LayerSizes = (64, 32),
        activation: Activation = "relu",
        dropout: Dropout = 0.0,
    ) -> None:
        super().__init__(layout)
        layers = check_cross_layers(self.name, "cross_layers", cross_layers)
        rank = check_low_rank(self.name, "low_rank", low_rank)
        self.structure = check_structure(self.name, "structure", structure)
        hidden, act, p = check_deep_mlp(self.name, deep_mlp, activation, dropout)
        self.width = sum(self.field_dims) + self.num_dense
        self.cross = nn.ModuleList(CrossLayer(self.width, rank) for _ in range(layers))
        self.deep: MLP | None = MLP(self.width, hidden, act, dropout=p) if hidden else None
        if self.deep is None:  # the cross network alone
            head_in = self.width
        elif self.structure == "stacked":
            head_in = self.deep.out_features
        else:
            head_in = self.width + self.deep.out_features
        self.head = nn.Linear(head_in, 1)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        self.check_batch(dense, sparse)
        x0 = torch.cat([sparse.flatten(1), dense], dim=1)  # flat input: flatten is a no-op
        x = x0
        for layer in self.cross:
            x = layer(x0, x)
        if self.deep is not None:
            x = self.deep(x) if self.structure == "stacked" else torch.cat([x, self.deep(x0)], 1)
        return self.head(x).squeeze(1)
