"""The built-in models: shapes, gradients, reference formulas, determinism, bad input."""

from __future__ import annotations

import ast
import io
import itertools
import re
import typing
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from daskhps.errors import ConfigError, DataError
from daskhps.models import BUILTIN_MODELS, DLRM, DCNv2, DeepFM, WideDeep, build_model, model_options
from daskhps.models.deepfm import fm_interaction
from daskhps.models.dlrm import ONE_PRODUCT_FROM_WIDTH, dot_interaction
from daskhps.models.layers import ACTIVATIONS, Activation

NAMES = sorted(BUILTIN_MODELS)
D = 6


def _inputs(
    model: nn.Module, batch: int, num_dense: int, num_fields: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    dense = torch.randn(batch, num_dense, generator=gen)
    sparse = torch.randn(batch, num_fields, model.sparse_dim(D), generator=gen)
    return dense, sparse.requires_grad_(True)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("num_dense", [0, 13])
@pytest.mark.parametrize("batch", [1, 7])
def test_forward_shape_and_dtype(name: str, num_dense: int, batch: int) -> None:
    model = build_model(name, num_dense=num_dense, num_fields=5, embedding_dim=D)
    out = model(*_inputs(model, batch, num_dense, 5))
    assert out.shape == (batch,)
    assert out.dtype == torch.float32


def test_every_builtin_is_in_the_docs_table_with_its_options_and_defaults() -> None:
    text = (Path(__file__).parents[2] / "docs" / "models.md").read_text()
    table = text.partition("## Built-in models\n\n")[2].partition("\n\n")[0]
    rows = {m[0]: m[1] for m in re.findall(r"^\| `(\w+)` \|.*\| ([^|]+) \|$", table, re.M)}
    assert sorted(rows) == NAMES
    for name, cell in rows.items():
        shown = dict(re.findall(r"`(\w+)=([^`]+)`", cell))
        want = model_options(BUILTIN_MODELS[name])
        assert want is not None
        assert {k: ast.literal_eval(v) for k, v in shown.items()} == want, name


def test_sparse_dim() -> None:
    assert DLRM.sparse_dim(D) == D
    assert DeepFM.sparse_dim(D) == D + 1
    assert WideDeep.sparse_dim(D) == D + 1
    assert DCNv2.sparse_dim(D) == D


@pytest.mark.parametrize("name", NAMES)
def test_gradients_reach_every_parameter_and_every_field(name: str) -> None:
    torch.manual_seed(0)
    model = build_model(name, num_dense=4, num_fields=3, embedding_dim=D)
    dense, sparse = _inputs(model, 32, 4, 3)
    model(dense, sparse).sum().backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, pname
    assert sparse.grad is not None
    per_field = sparse.grad.abs().sum(dim=(0, 2))
    assert torch.all(per_field > 0), per_field
    if model.sparse_dim(D) == D + 1:  # the wide weight enters the logit with slope 1
        assert torch.equal(sparse.grad[..., -1], torch.ones(32, 3))


def test_dot_interaction_matches_naive_loop() -> None:
    gen = torch.Generator().manual_seed(0)
    vectors = torch.randn(5, 4, 3, generator=gen)
    got = dot_interaction(vectors, torch.triu_indices(4, 4, offset=1))
    want = torch.stack(
        [(vectors[:, i] * vectors[:, j]).sum(1) for i, j in itertools.combinations(range(4), 2)],
        dim=1,
    )
    torch.testing.assert_close(got, want)


WIDE = ONE_PRODUCT_FROM_WIDTH  # vectors this wide take the hand-written backward


@pytest.mark.parametrize("width", [3, WIDE])  # autograd's backward, then the hand-written one
@pytest.mark.parametrize("offset", [1, 0])  # the strict upper triangle, and with the diagonal
def test_dot_interaction_gradient_is_autograds_of_the_naive_products(
    offset: int, width: int
) -> None:
    # Wide vectors' backward is written by hand ((G + G^T) X, one product); check it against
    # autograd through the plain products, and numerically in double precision.
    gen = torch.Generator().manual_seed(1)
    n = 5
    pairs = torch.triu_indices(n, n, offset=offset)
    vectors = torch.randn(7, n, width, generator=gen, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(7, pairs.shape[1], generator=gen, dtype=torch.float64)
    out = dot_interaction(vectors, pairs)
    assert ("PairDots" in type(out.grad_fn).__name__) == (width >= WIDE)
    (out * weights).sum().backward()
    got = vectors.grad
    vectors.grad = None
    naive = (vectors[:, pairs[0]] * vectors[:, pairs[1]]).sum(2)
    (naive * weights).sum().backward()
    torch.testing.assert_close(got, vectors.grad)
    assert torch.autograd.gradcheck(
        lambda v: dot_interaction(v, pairs), (vectors.detach().requires_grad_(),)
    )


def test_dot_interaction_takes_any_distinct_pairs_in_any_order() -> None:
    gen = torch.Generator().manual_seed(2)
    n = 4
    everything = torch.tensor(list(itertools.product(range(n), repeat=2))).T
    pairs = everything[:, torch.randperm(n * n, generator=gen)[:9]]  # lower, upper, diagonal
    vectors = torch.randn(3, n, WIDE, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v: dot_interaction(v, pairs), (vectors,))
    want = (vectors[:, pairs[0]] * vectors[:, pairs[1]]).sum(2)
    torch.testing.assert_close(dot_interaction(vectors, pairs), want)


def test_dlrm_traces_saves_and_loads_as_torchscript_with_the_same_scores() -> None:
    # What `daskhps export` does: TorchScript cannot save a Python autograd function, so a
    # trace must see the interaction's plain operations, with the same forward bit for bit.
    torch.manual_seed(0)
    model = DLRM.build(num_dense=4, num_fields=3, embedding_dim=WIDE)
    gen = torch.Generator().manual_seed(0)
    dense = torch.randn(5, 4, generator=gen)
    sparse = torch.randn(5, 3, WIDE, generator=gen, requires_grad=True)
    with warnings.catch_warnings():  # torch.jit.trace is deprecated, and says so
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(model, (dense, sparse.detach()))
    buf = io.BytesIO()
    torch.jit.save(traced, buf)
    buf.seek(0)
    loaded = torch.jit.load(buf)
    trained = model(dense, sparse)  # the training path: through the hand-written backward
    with torch.no_grad():
        assert torch.equal(loaded(dense, sparse.detach()), trained.detach())
        assert torch.equal(model(dense, sparse), trained.detach())


def test_dlrm_forward_matches_reference() -> None:
    torch.manual_seed(0)
    model = DLRM.build(num_dense=4, num_fields=3, embedding_dim=D)
    dense, sparse = _inputs(model, 5, 4, 3)
    x = model.bottom(dense)  # type: ignore[misc]
    vecs = [x, *sparse.unbind(1)]
    dots = [(vecs[i] * vecs[j]).sum(1) for i, j in itertools.combinations(range(4), 2)]
    want = model.top(torch.cat([x, torch.stack(dots, 1)], 1)).squeeze(1)
    torch.testing.assert_close(model(dense, sparse), want)
    assert model.top[0].in_features == D + 4 * 3 // 2


def test_dlrm_without_dense_interacts_fields_only() -> None:
    model = DLRM.build(num_dense=0, num_fields=4, embedding_dim=D)
    assert model.bottom is None
    assert model.top[0].in_features == 4 * 3 // 2


def test_fm_interaction_matches_pairwise_sum() -> None:
    gen = torch.Generator().manual_seed(0)
    emb = torch.randn(5, 4, 3, generator=gen)
    want = sum((emb[:, i] * emb[:, j]).sum(1) for i, j in itertools.combinations(range(4), 2))
    torch.testing.assert_close(fm_interaction(emb), want)


@pytest.mark.parametrize("cls", [DeepFM, WideDeep])
def test_wide_models_match_reference(cls: type[DeepFM] | type[WideDeep]) -> None:
    torch.manual_seed(0)
    model = cls.build(num_dense=4, num_fields=3, embedding_dim=D)
    dense, sparse = _inputs(model, 5, 4, 3)
    emb, w = sparse[..., :D], sparse[..., D]
    linear = model.wide  # DeepFM is Wide & Deep plus the FM term
    deep = model.deep(torch.cat([emb.reshape(5, -1), dense], 1)).squeeze(1)
    want = linear.bias + dense @ linear.weight.weight.squeeze(0) + w.sum(1) + deep
    if cls is DeepFM:
        want = want + fm_interaction(emb)
    torch.testing.assert_close(model(dense, sparse), want)


@pytest.mark.parametrize("name", NAMES)
def test_initialisation_is_deterministic_given_seed(name: str) -> None:
    def make(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return build_model(name, num_dense=3, num_fields=4, embedding_dim=D)

    a, b, c = make(7), make(7), make(8)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)
    inputs = _inputs(a, 4, 3, 4)
    assert torch.equal(a(*inputs), b(*inputs))


def test_state_dict_holds_only_weights() -> None:
    model = DLRM.build(num_dense=3, num_fields=4, embedding_dim=D)
    assert "pairs" not in model.state_dict()


@pytest.mark.parametrize("name", NAMES)
def test_dropout_only_in_training(name: str) -> None:
    model = build_model(name, num_dense=3, num_fields=4, embedding_dim=D, dropout=0.5)
    assert any(isinstance(m, nn.Dropout) for m in model.modules())
    inputs = _inputs(model, 64, 3, 4)
    torch.manual_seed(0)
    assert not torch.equal(model(*inputs), model(*inputs))
    model.eval()
    assert torch.equal(model(*inputs), model(*inputs))


@pytest.mark.parametrize("name", NAMES)
def test_layer_sizes_and_activation_options(name: str) -> None:
    mlp = "top_mlp" if name == "dlrm" else "deep_mlp"
    model = build_model(
        name, num_dense=3, num_fields=4, embedding_dim=D, activation="tanh", **{mlp: [9, 5, 2]}
    )
    mlp_part = {"dlrm": ["top"], "dcnv2": ["deep", "head"]}.get(name, ["deep"])
    linears = [
        m for part in mlp_part for m in getattr(model, part).modules() if isinstance(m, nn.Linear)
    ]
    assert [m.out_features for m in linears] == [9, 5, 2, 1]
    assert any(isinstance(m, nn.Tanh) for m in model.modules())
    assert not any(isinstance(m, nn.ReLU) for m in model.modules())


def test_activation_names_agree_with_annotation() -> None:
    literal = typing.get_args(typing.get_args(Activation)[0])
    assert sorted(literal) == sorted(ACTIVATIONS)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"dropout": 1.0}, "'dropout' must be a number in \\[0, 1\\)"),
        ({"dropout": "high"}, "'dropout'"),
        ({"activation": "swish"}, "'activation'.* must be one of"),
        ({"hidden": [8]}, "unknown option 'hidden'.*allowed options: \\['activation'"),
    ],
)
def test_bad_options(name: str, options: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        build_model(name, num_dense=3, num_fields=4, embedding_dim=D, **options)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("sizes", [[0], [8, -1], "64", [1.5], [True]])
def test_bad_layer_sizes(name: str, sizes: object) -> None:
    mlp = "top_mlp" if name == "dlrm" else "deep_mlp"
    with pytest.raises(ConfigError, match=mlp):
        build_model(name, num_dense=3, num_fields=4, embedding_dim=D, **{mlp: sizes})


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    "layout",
    [
        {"num_dense": -1, "num_fields": 4, "embedding_dim": D},
        {"num_dense": 3, "num_fields": 0, "embedding_dim": D},
        {"num_dense": 3, "num_fields": 4, "embedding_dim": 0},
        {"num_dense": 3, "num_fields": 4, "embedding_dim": 2.0},
        {"num_dense": True, "num_fields": 4, "embedding_dim": D},
    ],
)
def test_bad_layout(name: str, layout: dict[str, typing.Any]) -> None:
    with pytest.raises(ConfigError, match="must be an integer >="):
        build_model(name, **layout)


@pytest.mark.parametrize("name", NAMES)
def test_batch_of_wrong_shape_is_a_data_error(name: str) -> None:
    model = build_model(name, num_dense=3, num_fields=4, embedding_dim=D)
    dense, sparse = _inputs(model, 2, 3, 4)
    for bad in [
        (dense[:, :2], sparse),
        (dense, sparse[:, :3]),
        (dense, sparse[..., :-1]),
        (dense[:1], sparse),
        (dense[0], sparse),
    ]:
        with pytest.raises(DataError, match=f"model '{name}': expected dense \\[B, 3\\]"):
            model(*bad)
