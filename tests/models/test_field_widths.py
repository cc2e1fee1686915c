"""Per-field embedding widths: equal ones build today's model bit for bit, unequal ones read the
flat layout, train, match a hand-computed reference, and reach a user's model; bad input is one
ConfigError line."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from torch import nn

from daskhps.errors import ConfigError, DataError
from daskhps.models import (
    BUILTIN_MODELS,
    DLRM,
    DeepFM,
    ModelSpec,
    WideDeep,
    build_model,
    sparse_dim_of,
    split_fields,
)
from daskhps.models.base import describe_widths
from daskhps.models.layers import FieldProjection
from tests.models import user_model

NAMES = sorted(BUILTIN_MODELS)
USER = "tests.models.user_model"
DIMS = (3, 8, 5, 8, 1)  # one field narrower than the rest by each amount; two at the maximum
D = max(DIMS)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    # Tiny matmuls gain nothing from intra-op threads on a busy machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _flat_inputs(
    model: nn.Module, batch: int, num_dense: int, dims: tuple[int, ...], seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    width = sum(sparse_dim_of(model, d) for d in dims)
    dense = torch.randn(batch, num_dense, generator=gen)
    return dense, torch.randn(batch, width, generator=gen).requires_grad_(True)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("num_dense", [0, 3])
@pytest.mark.parametrize("as_list", [False, True])
def test_equal_widths_build_the_model_without_field_dims(
    name: str, num_dense: int, as_list: bool
) -> None:
    def make(field_dims: object) -> nn.Module:
        torch.manual_seed(3)
        return build_model(
            name, num_dense=num_dense, num_fields=4, embedding_dim=6, field_dims=field_dims
        )

    plain = make(None)
    after_plain = torch.rand(4)
    same = make([6] * 4 if as_list else (6,) * 4)
    assert torch.equal(torch.rand(4), after_plain)  # the same draws from the global RNG
    a, b = plain.state_dict(), same.state_dict()
    assert list(a) == list(b)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert plain.field_dims == same.field_dims == (6, 6, 6, 6)
    assert plain.equal_widths and same.equal_widths
    gen = torch.Generator().manual_seed(1)
    dense = torch.randn(5, num_dense, generator=gen)
    sparse = torch.randn(5, 4, plain.sparse_dim(6), generator=gen)
    assert torch.equal(plain(dense, sparse), same(dense, sparse))


@pytest.mark.parametrize("name", NAMES)
def test_unequal_widths_gradients_reach_every_parameter_and_column(name: str) -> None:
    torch.manual_seed(0)
    model = build_model(name, num_dense=3, num_fields=len(DIMS), embedding_dim=D, field_dims=DIMS)
    assert model.field_dims == DIMS and not model.equal_widths
    dense, sparse = _flat_inputs(model, 32, 3, DIMS)
    out = model(dense, sparse)
    assert out.shape == (32,) and out.dtype == torch.float32
    out.sum().backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, pname
    assert sparse.grad is not None and sparse.grad.shape == sparse.shape
    # Every column of every field moves the logit (the wide weight with slope 1).
    assert torch.all(sparse.grad.abs().sum(0) > 0)
    if model.sparse_dim(D) == D + 1:
        wide_cols = torch.tensor(DIMS).add(1).cumsum(0) - 1
        assert torch.equal(sparse.grad[:, wide_cols], torch.ones(32, len(DIMS)))


@pytest.mark.parametrize("name", NAMES)
def test_unequal_widths_train(name: str) -> None:
    torch.manual_seed(0)
    model = build_model(name, num_dense=3, num_fields=len(DIMS), embedding_dim=D, field_dims=DIMS)
    dense, sparse = _flat_inputs(model, 64, 3, DIMS)
    rows = nn.Parameter(sparse.detach().clone())  # stands in for the tables' rows
    labels = torch.randint(0, 2, (64,), generator=torch.Generator().manual_seed(2)).float()
    opt = torch.optim.Adam([*model.parameters(), rows], lr=0.01)
    losses = []
    for _ in range(30):
        loss = F.binary_cross_entropy_with_logits(model(dense, rows), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], losses


def test_parameters_for_unequal_widths() -> None:
    torch.manual_seed(0)
    dlrm = DLRM.build(num_dense=3, num_fields=len(DIMS), embedding_dim=D, field_dims=DIMS)
    keys = list(dlrm.state_dict())
    # One projection per narrower field, created after every other parameter.
    assert keys[-3:] == [f"project.by_field.{f}.weight" for f in (0, 2, 4)]
    assert [tuple(dlrm.state_dict()[k].shape) for k in keys[-3:]] == [(D, 3), (D, 5), (D, 1)]
    n = len(DIMS) + 1
    assert dlrm.top[0].in_features == D + n * (n - 1) // 2  # as for equal widths
    deepfm = DeepFM.build(num_dense=3, num_fields=len(DIMS), embedding_dim=D, field_dims=DIMS)
    assert list(deepfm.state_dict())[-3:] == keys[-3:]
    wide = WideDeep.build(num_dense=3, num_fields=len(DIMS), embedding_dim=D, field_dims=DIMS)
    assert wide.deep[0].in_features == sum(DIMS) + 3
    assert not any(isinstance(m, FieldProjection) for m in wide.modules())
    dcn = build_model("dcnv2", num_dense=3, num_fields=len(DIMS), embedding_dim=D, field_dims=DIMS)
    assert dcn.width == sum(DIMS) + 3
    assert dcn.sparse_widths == DIMS and deepfm.sparse_widths == tuple(d + 1 for d in DIMS)


def _reference(
    model: DLRM | DeepFM, dense: torch.Tensor, sparse: torch.Tensor, dims: tuple[int, ...]
) -> np.ndarray:
    """DLRM's or DeepFM's logit in float64, example by example, field by field."""
    m = copy.deepcopy(model).double()
    x = dense.double().numpy()
    s = sparse.detach().double().numpy()
    wide = isinstance(model, DeepFM)
    proj = {int(f): lin.weight.detach().numpy() for f, lin in m.project.by_field.items()}  # type: ignore[union-attr]
    out = np.empty(len(x))
    for b in range(len(x)):
        emb, weights, at = [], [], 0
        for d in dims:
            emb.append(s[b, at : at + d])
            weights.append(s[b, at + d] if wide else 0.0)
            at += d + (1 if wide else 0)
        vecs = [proj[f] @ e if f in proj else e for f, e in enumerate(emb)]
        dense_b = torch.from_numpy(x[b : b + 1])
        with torch.no_grad():
            if isinstance(m, DLRM):
                if m.bottom is not None:
                    vecs = [m.bottom(dense_b)[0].numpy(), *vecs]
                dots = [vecs[i] @ vecs[j] for i, j in itertools.combinations(range(len(vecs)), 2)]
                top_in = ([vecs[0]] if m.bottom is not None else []) + [np.array(dots)]
                out[b] = m.top(torch.from_numpy(np.concatenate(top_in))[None])[0, 0].item()
            else:
                fm = sum(vecs[i] @ vecs[j] for i, j in itertools.combinations(range(len(vecs)), 2))
                deep_in = torch.from_numpy(np.concatenate([*emb, x[b]]))[None]
                linear = m.wide.bias.item() + sum(weights)
                if m.wide.weight is not None:
                    linear += float(m.wide.weight.weight[0].numpy() @ x[b])
                out[b] = linear + fm + m.deep(deep_in)[0, 0].item()
    return out


@settings(max_examples=30, deadline=None)
@given(
    cls=st.sampled_from([DLRM, DeepFM]),
    dims=st.lists(st.integers(1, 6), min_size=2, max_size=5).map(tuple),
    num_dense=st.sampled_from([0, 3]),
    batch=st.integers(1, 4),
    seed=st.integers(0, 2**31 - 1),
)
def test_projected_interaction_matches_reference(
    cls: type[DLRM] | type[DeepFM], dims: tuple[int, ...], num_dense: int, batch: int, seed: int
) -> None:
    assume(len(set(dims)) > 1)
    torch.manual_seed(seed)
    model = cls.build(
        num_dense=num_dense, num_fields=len(dims), embedding_dim=max(dims), field_dims=dims
    )
    dense, sparse = _flat_inputs(model, batch, num_dense, dims, seed=seed)
    with torch.no_grad():
        got = model(dense, sparse).double().numpy()
    want = _reference(model, dense, sparse, dims)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@settings(max_examples=30, deadline=None)
@given(
    dims=st.lists(st.sampled_from([1, 2, 3, 6]), min_size=1, max_size=7).map(tuple),
    batch=st.integers(1, 5),
    seed=st.integers(0, 2**31 - 1),
)
def test_field_projection_is_each_fields_linear_with_its_gradients(
    dims: tuple[int, ...], batch: int, seed: int
) -> None:
    # The fields of one width go through one batched product: the same values and gradients
    # as each field's own Linear, field by field.
    torch.manual_seed(seed)
    width = 6
    proj = FieldProjection(dims, width)
    gen = torch.Generator().manual_seed(seed)
    fields = [torch.randn(batch, d, generator=gen, requires_grad=True) for d in dims]
    upstream = torch.randn(batch, len(dims), width, generator=gen)
    (proj(fields) * upstream).sum().backward()
    want_out = torch.stack(
        [
            proj.by_field[str(f)](e) if d != width else e
            for f, (e, d) in enumerate(zip(fields, dims, strict=True))
        ],
        dim=1,
    )
    torch.testing.assert_close(proj(fields), want_out)
    got = [e.grad for e in fields], {k: m.weight.grad for k, m in proj.by_field.items()}
    for e in fields:
        e.grad = None
    proj.zero_grad()
    (want_out * upstream).sum().backward()
    torch.testing.assert_close(got[0], [e.grad for e in fields])
    torch.testing.assert_close(got[1], {k: m.weight.grad for k, m in proj.by_field.items()})


def test_split_fields_matches_slicing() -> None:
    sparse = torch.arange(2 * 17, dtype=torch.float32).view(2, 17)
    emb, wide = split_fields(sparse[:, :14], (3, 1, 4, 6))  # 3 + 1 + 4 + 6 = 14
    assert wide is None
    assert [e.tolist() for e in emb] == [
        sparse[:, a:b].tolist() for a, b in [(0, 3), (3, 4), (4, 8), (8, 14)]
    ]
    emb, wide = split_fields(sparse, (3, 1, 4, 5), wide=True)  # 4 + 2 + 5 + 6 = 17
    assert [e.tolist() for e in emb] == [
        sparse[:, a:b].tolist() for a, b in [(0, 3), (4, 5), (6, 10), (11, 16)]
    ]
    assert wide is not None and wide.tolist() == sparse[:, [3, 5, 10, 16]].tolist()


def test_flat_layout_of_equal_widths_is_the_flattened_rows() -> None:
    sparse = torch.randn(3, 4, 7)
    emb, wide = split_fields(sparse.flatten(1), (6,) * 4, wide=True)
    assert torch.equal(torch.stack(emb, 1), sparse[..., :-1])
    assert wide is not None and torch.equal(wide, sparse[..., -1])


@pytest.mark.parametrize("name", NAMES)
def test_unequal_widths_check_the_flat_layout(name: str) -> None:
    model = build_model(name, num_dense=3, num_fields=len(DIMS), embedding_dim=D, field_dims=DIMS)
    dense, sparse = _flat_inputs(model, 2, 3, DIMS)
    total = sparse.shape[1]
    per_field = torch.zeros(2, len(DIMS), model.sparse_dim(D))  # the equal-width layout
    for bad in [(dense, sparse[:, :-1]), (dense, per_field), (dense[:, :2], sparse)]:
        with pytest.raises(DataError, match=rf"expected dense \[B, 3\] and sparse \[B, {total}\]"):
            model(*bad)


@pytest.mark.parametrize(
    ("field_dims", "embedding_dim", "match"),
    [
        ((8, 4), 8, r"field_dims must hold 4 integers >= 1 \(one per field\), got \[8, 4\]"),
        ((8, 4, 0, 8), 8, r"must hold 4 integers >= 1 .* got \[8, 4, 0, 8\]"),
        ((8, True, 4, 8), 8, "must hold 4 integers"),
        ((8, 4.0, 4, 8), 8, "must hold 4 integers"),
        ("8448", 8, "field_dims must be a list of per-field embedding widths, got '8448'"),
        ((8, 4, 4, 8), 16, "embedding_dim must be the largest of field_dims, 8, got 16"),
        ((4, 4, 4, 4), 8, "embedding_dim must be the largest of field_dims, 4, got 8"),
    ],
)
@pytest.mark.parametrize("name", ["dlrm", f"{USER}:TinyModel"])
def test_bad_field_dims(name: str, field_dims: object, embedding_dim: int, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        build_model(
            name, num_dense=3, num_fields=4, embedding_dim=embedding_dim, field_dims=field_dims
        )
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("cls", "name"), [(DLRM, "dlrm"), (DeepFM, "deepfm")])
def test_field_projection_off_refuses_unequal_widths(cls: type[nn.Module], name: str) -> None:
    spec = ModelSpec.from_dict(
        {"name": name, "options": {"field_projection": False}}, source="run.yaml"
    )
    # Equal widths need no projection, so the option changes nothing there.
    assert spec.build(num_dense=3, num_fields=4, embedding_dim=8, field_dims=(8,) * 4)
    with pytest.raises(ConfigError) as info:
        spec.build(num_dense=3, num_fields=4, embedding_dim=8, field_dims=(8, 4, 4, 8))
    msg = str(info.value)
    assert msg.startswith(f"run.yaml: model: model {name!r}: the ")
    assert "widths 4 and 8 (4: fields 1, 2; 8: fields 0, 3)" in msg
    assert "set model.options.field_projection to true" in msg
    assert "\n" not in msg


def test_field_dims_is_not_an_option() -> None:
    with pytest.raises(ConfigError, match=r"model\.options\.field_dims: 'field_dims' is set from"):
        ModelSpec.from_dict({"name": "dlrm", "options": {"field_dims": [8]}}, source="run.yaml")
    with pytest.raises(ConfigError, match="'field_dims' is set from"):
        ModelSpec(f"{USER}:KwargsModel", {"field_dims": [8]})


def test_describe_widths() -> None:
    dims = (32, 8, 32, 32, 8, 32, 32, 32, 32)
    assert (
        describe_widths(dims) == "widths 8 and 32 (8: fields 1, 4; 32: fields 0, 2, 3, 5, 6, ...)"
    )
    assert describe_widths((4, 8, 16)) == "widths 4, 8 and 16 (4: field 0; 8: field 1; 16: field 2)"


# A user's model


def test_user_model_without_field_dims_takes_equal_widths() -> None:
    model = build_model(
        f"{USER}:TinyModel", num_dense=3, num_fields=4, embedding_dim=5, field_dims=[5] * 4
    )
    assert isinstance(model, user_model.TinyModel)


def test_user_model_without_field_dims_refuses_unequal_widths() -> None:
    spec = ModelSpec.from_dict({"name": f"{USER}:TinyModel"}, source="run.yaml")
    with pytest.raises(ConfigError) as info:
        spec.build(num_dense=3, num_fields=4, embedding_dim=8, field_dims=(8, 4, 8, 8))
    assert str(info.value) == (
        f"run.yaml: model: model '{USER}:TinyModel' takes one embedding_dim for every field, but "
        "the tables give the fields widths 4 and 8 (4: field 1; 8: fields 0, 2, 3); give every "
        "table the same dim, or add a field_dims parameter to the model"
    )


def test_user_model_with_field_dims_gets_them_when_they_differ() -> None:
    name = f"{USER}:PerFieldTiny"
    model = build_model(name, num_dense=3, num_fields=3, embedding_dim=6, field_dims=(2, 6, 4))
    assert isinstance(model, user_model.PerFieldTiny)
    assert model.got_field_dims == (2, 6, 4)
    # The probe fed it the flat layout of sparse_dim(D_f) = D_f + 1 floats per field.
    assert model.mlp[0].in_features == 3 + 12
    out = model(torch.zeros(2, 3), torch.zeros(2, 3 + 7 + 5))
    assert out.shape == (2,)
    same = build_model(name, num_dense=3, num_fields=3, embedding_dim=6, field_dims=(6, 6, 6))
    assert same.got_field_dims is None  # equal widths: built as without field_dims
    assert same(torch.zeros(2, 3), torch.zeros(2, 3, 7)).shape == (2,)


def test_user_model_taking_kwargs_gets_field_dims_and_the_flat_probe() -> None:
    # KwargsModel reads [B, F, D] whatever it is given: the flat probe batch shows it.
    with pytest.raises(ConfigError, match=r"forward\(dense \[2, 3\], sparse \[2, 6\]\) on a probe"):
        build_model(
            f"{USER}:KwargsModel", num_dense=3, num_fields=2, embedding_dim=4, field_dims=(4, 2)
        )
    model = user_model.KwargsModel(num_dense=3, num_fields=2, embedding_dim=4, field_dims=(4, 2))
    assert model.options["field_dims"] == (4, 2)
