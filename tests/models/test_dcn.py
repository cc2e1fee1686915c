"""DCN-v2: the cross layer against its formula, the two structures, gradients to the table's
rows, parameter counts, and its options' errors."""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import given, settings

from daskhps.errors import ConfigError
from daskhps.models import DCNv2, ModelSpec, build_model, model_options
from daskhps.models.dcn import CrossLayer
from tests.models.helpers import (
    NUM_DENSE,
    NUM_FIELDS,
    VOCAB,
    TableAndModel,
    make_batch,
    make_truth,
)

D = 4


def _cross_reference(
    x0: np.ndarray,
    x: np.ndarray,
    bias: np.ndarray,
    w: np.ndarray | None = None,
    u: np.ndarray | None = None,
    v: np.ndarray | None = None,
) -> np.ndarray:
    """The paper's cross layer, example by example in float64:
    ``x0 * (W x + b) + x``, or ``x0 * (U (V^T x) + b) + x`` for low rank."""
    out = np.empty(x.shape, dtype=np.float64)
    for i in range(len(x)):
        xi = x[i].astype(np.float64)
        if w is not None:
            wx = w.astype(np.float64) @ xi
        else:
            assert u is not None and v is not None
            wx = u.astype(np.float64) @ (v.astype(np.float64).T @ xi)
        out[i] = x0[i].astype(np.float64) * (wx + bias.astype(np.float64)) + xi
    return out


def _layer_with(layer: CrossLayer, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Overwrite ``layer``'s parameters with random values; return them as float32 arrays."""
    values = {}
    with torch.no_grad():
        for name, p in layer.named_parameters():
            values[name] = rng.standard_normal(tuple(p.shape)).astype(np.float32)
            p.copy_(torch.from_numpy(values[name]))
    return values


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 6),
    width=st.integers(1, 24),
    rank=st.one_of(st.none(), st.integers(1, 8)),
    seed=st.integers(0, 2**32 - 1),
)
def test_cross_layer_matches_its_formula(
    batch: int, width: int, rank: int | None, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    layer = CrossLayer(width, low_rank=rank)
    params = _layer_with(layer, rng)
    x0 = rng.standard_normal((batch, width)).astype(np.float32)
    x = rng.standard_normal((batch, width)).astype(np.float32)
    with torch.no_grad():
        got = layer(torch.from_numpy(x0), torch.from_numpy(x)).numpy()
    want = _cross_reference(
        x0, x, params["bias"], w=params.get("weight"), u=params.get("u"), v=params.get("v")
    )
    # float32 against float64: a dot product of ``width`` terms of about 1, times x0.
    scale = np.abs(x0).max() * (np.abs(want).max() + width)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * scale)
    # and the same layer in float64 agrees to rounding: the formula, not an approximation of it
    with torch.no_grad():
        got64 = layer.double()(torch.from_numpy(x0).double(), torch.from_numpy(x).double())
    np.testing.assert_allclose(got64.numpy(), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("rank", [None, 3])
@pytest.mark.parametrize("structure", ["stacked", "parallel"])
def test_forward_matches_the_paper(seed: int, rank: int | None, structure: str) -> None:
    """x0 = [e_1..e_F, dense]; L cross layers; then the deep MLP and the logit layer as the
    structure says: w . MLP(x_L) + c, or w . [x_L, MLP(x0)] + c."""
    torch.manual_seed(seed)
    model = DCNv2.build(
        num_dense=3,
        num_fields=5,
        embedding_dim=D,
        cross_layers=2,
        low_rank=rank,
        structure=structure,  # type: ignore[arg-type]
        deep_mlp=(7, 6),
    )
    gen = torch.Generator().manual_seed(seed)
    dense, sparse = torch.randn(9, 3, generator=gen), torch.randn(9, 5, D, generator=gen)
    x0 = np.concatenate([sparse.reshape(9, -1).numpy(), dense.numpy()], axis=1)
    x = x0
    for layer in model.cross:
        p = {n: t.detach().numpy() for n, t in layer.named_parameters()}
        x = _cross_reference(x0, x, p["bias"], w=p.get("weight"), u=p.get("u"), v=p.get("v"))
    assert model.deep is not None
    with torch.no_grad():
        xl = torch.from_numpy(x).float()
        if structure == "stacked":
            last = model.deep(xl)
        else:
            last = torch.cat([xl, model.deep(torch.from_numpy(x0))], dim=1)
        want = model.head(last).squeeze(1)
        got = model(dense, sparse)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("options", "head_in"),
    [
        ({"structure": "stacked"}, 6),  # the deep MLP's last width
        ({"structure": "parallel"}, 23 + 6),  # [x_L, MLP(x0)]
        ({"structure": "stacked", "deep_mlp": []}, 23),  # the cross network alone
        ({"structure": "parallel", "deep_mlp": []}, 23),
        ({"structure": "parallel", "low_rank": 2}, 23 + 6),
    ],
)
def test_structures_have_the_documented_shapes(options: dict[str, object], head_in: int) -> None:
    options = {"deep_mlp": [8, 6], "cross_layers": 2, **options}
    model = build_model("dcnv2", num_dense=3, num_fields=5, embedding_dim=D, **options)
    assert isinstance(model, DCNv2)
    width = 5 * D + 3
    assert model.width == width
    assert len(model.cross) == 2
    for layer in model.cross:
        rank = options.get("low_rank")
        if rank is None:
            assert layer.weight is not None and layer.weight.shape == (width, width)
            assert layer.u is None and layer.v is None
        else:
            assert layer.weight is None
            assert layer.u is not None and layer.u.shape == (width, rank)
            assert layer.v is not None and layer.v.shape == (width, rank)
        assert layer.bias.shape == (width,)
    if options["deep_mlp"]:
        assert model.deep is not None and model.deep[0].in_features == width  # x_L or x0
    else:
        assert model.deep is None
    assert (model.head.in_features, model.head.out_features) == (head_in, 1)
    out = model(torch.randn(11, 3), torch.randn(11, 5, D))
    assert out.shape == (11,) and out.dtype == torch.float32


def test_parameter_counts_full_and_low_rank() -> None:
    # The docs' example: 26 fields x 16 + 13 dense = 429 inputs; d^2 + d vs 2 d r + d a layer.
    def cross_params(**options: object) -> int:
        model = build_model(
            "dcnv2", num_dense=13, num_fields=26, embedding_dim=16, deep_mlp=[], **options
        )
        assert isinstance(model, DCNv2)
        return sum(p.numel() for p in model.cross.parameters())

    assert cross_params(cross_layers=1) == 429 * 429 + 429 == 184_470
    assert cross_params(cross_layers=3, low_rank=64) == 3 * (2 * 429 * 64 + 429) == 166_023


@pytest.mark.parametrize(
    "options", [{}, {"structure": "parallel"}, {"low_rank": 2}, {"deep_mlp": []}]
)
def test_gradients_reach_the_rows_of_the_table(options: dict[str, object]) -> None:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    model = build_model(
        "dcnv2", num_dense=NUM_DENSE, num_fields=NUM_FIELDS, embedding_dim=D, **options
    )
    net = TableAndModel(model, embedding_dim=D)
    batch = make_batch(64, gen, make_truth(gen))
    net(batch).sum().backward()
    assert net.table.grad is not None
    touched = torch.zeros(NUM_FIELDS * VOCAB, dtype=torch.bool)
    touched[batch.keys] = True
    row_grad = net.table.grad.abs().sum(dim=1)
    assert torch.all(row_grad[touched] > 0)  # every looked-up row gets a gradient
    assert torch.all(row_grad[~touched] == 0)  # and no other row
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_options_and_defaults() -> None:
    assert model_options(DCNv2) == {
        "cross_layers": 3,
        "low_rank": None,
        "structure": "stacked",
        "deep_mlp": (64, 32),
        "activation": "relu",
        "dropout": 0.0,
    }
    spec = ModelSpec.from_dict(
        {"name": "dcnv2", "options": {"low_rank": None, "structure": "parallel"}}
    )
    assert ModelSpec.from_dict(spec.to_dict()) == spec
    model = spec.build(num_dense=2, num_fields=3, embedding_dim=D)
    assert isinstance(model, DCNv2) and model.structure == "parallel"


BAD = [
    ({"cross_layers": 0}, "cross_layers", "must be an integer >= 1"),
    ({"cross_layers": -2}, "cross_layers", "must be an integer >= 1"),
    ({"cross_layers": True}, "cross_layers", "must be an integer"),
    ({"cross_layers": "3"}, "cross_layers", "must be an integer"),
    ({"low_rank": 0}, "low_rank", "must be an integer >= 1 .*or null for full-rank"),
    ({"low_rank": 8.0}, "low_rank", "must be an integer or null"),
    ({"structure": "serial"}, "structure", "must be one of \\['stacked', 'parallel'\\]"),
    ({"structure": None}, "structure", "must be one of \\['stacked', 'parallel'\\]"),
]


@pytest.mark.parametrize(("options", "option", "match"), BAD)
def test_bad_options_give_one_clear_line(
    options: dict[str, object], option: str, match: str
) -> None:
    with pytest.raises(ConfigError, match=f"'{option}'.*{match}") as built:
        build_model("dcnv2", num_dense=3, num_fields=4, embedding_dim=D, **options)
    with pytest.raises(ConfigError, match=f"^run.yaml: model.options.{option}: .*{match}") as read:
        ModelSpec.from_dict({"name": "dcnv2", "options": options}, source="run.yaml")
    for e in (built.value, read.value):
        assert "\n" not in str(e) and "dcnv2" in str(e)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"cross_layers": 0}, "option 'cross_layers' must be an integer >= 1"),
        ({"low_rank": 0}, "option 'low_rank' must be an integer >= 1"),
        ({"structure": "serial"}, "option 'structure' must be 'stacked' .* or 'parallel'"),
    ],
)
def test_direct_construction_checks_too(options: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=f"model 'dcnv2': {match}"):
        DCNv2.build(num_dense=3, num_fields=4, embedding_dim=D, **options)  # type: ignore[arg-type]
