"""build_model by name and by import path, its errors, and ModelSpec validation."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest
import torch

from daskhps.errors import ConfigError
from daskhps.models import (
    BUILTIN_MODELS,
    DLRM,
    DCNv2,
    ModelSpec,
    build_model,
    model_options,
    resolve_model,
    sparse_dim_of,
)
from tests.models import user_model

USER = "tests.models.user_model"
LAYOUT = {"num_dense": 3, "num_fields": 4, "embedding_dim": 5}


def test_builtin_names() -> None:
    assert sorted(BUILTIN_MODELS) == ["dcnv2", "deepfm", "dlrm", "wide_deep"]
    assert resolve_model("dlrm") is DLRM
    assert isinstance(build_model("dlrm", **LAYOUT), DLRM)
    assert resolve_model("dcnv2") is DCNv2


def test_model_options_lists_defaults() -> None:
    assert model_options(DLRM) == {
        "bottom_mlp": (64,),
        "top_mlp": (64, 32),
        "activation": "relu",
        "dropout": 0.0,
        "field_projection": True,
    }
    assert model_options(user_model.KwargsModel) is None


def test_user_model_by_import_path() -> None:
    model = build_model(f"{USER}:TinyModel", **LAYOUT, hidden=3)
    assert isinstance(model, user_model.TinyModel)
    assert model.hidden == 3
    assert model.training  # the probe ran in eval mode and restored training mode
    assert sparse_dim_of(model, 5) == 5
    out = model(torch.zeros(2, 3), torch.zeros(2, 4, 5))
    assert out.shape == (2,)


def test_user_model_with_its_own_sparse_dim() -> None:
    model = build_model(f"{USER}:WideTiny", **LAYOUT)
    assert sparse_dim_of(model, 5) == 7
    assert ModelSpec(f"{USER}:WideTiny").sparse_dim(5) == 7


def test_sparse_dim_may_be_a_plain_attribute() -> None:
    class Fixed(user_model.TinyModel):
        sparse_dim = 9

    assert sparse_dim_of(Fixed, 5) == 9


def test_user_model_taking_any_option() -> None:
    model = build_model(f"{USER}:KwargsModel", **LAYOUT, anything=1)
    assert isinstance(model, user_model.KwargsModel)
    assert model.options["anything"] == 1


def test_probe_does_not_move_the_global_rng() -> None:
    torch.manual_seed(0)
    build_model(f"{USER}:TinyModel", **LAYOUT)
    after_build = torch.rand(3)
    torch.manual_seed(0)
    user_model.TinyModel(**LAYOUT)
    assert torch.equal(after_build, torch.rand(3))


@pytest.mark.parametrize(
    ("name", "match"),
    [
        (
            "mlp",
            "unknown model 'mlp': use one of \\['dcnv2', 'deepfm', 'dlrm', 'wide_deep'\\]",
        ),
        ("tests.models.no_such_module:Model", "'tests.models.no_such_module' failed to import"),
        (f"{USER}_broken:Model", "failed to import \\(RuntimeError: broken on purpose\\)"),
        (f"{USER}:Missing", "has no attribute 'Missing'"),
        (f"{USER}:", "must look like 'package.module:Class'"),
        (":Model", "must look like"),
        (f"{USER}:TinyModel:x", "must look like"),
        (f"{USER}:not_a_class", "is not a torch.nn.Module subclass"),
        (f"{USER}:NotAModule", "is not a torch.nn.Module subclass"),
        (f"{USER}:MissingArgs", "it lacks \\['num_fields'\\]"),
        (f"{USER}:PositionalOnly", "it lacks \\['num_dense', 'num_fields', 'embedding_dim'\\]"),
        (f"{USER}:FailingInit", "constructor failed with RuntimeError: cannot build on purpose"),
        (f"{USER}:NeedsWidth", "needs option\\(s\\) \\['width'\\]"),
        (f"{USER}:ColumnLogits", "returned shape \\[2, 1\\], expected \\[2\\] \\(squeeze"),
        (f"{USER}:DoubleLogits", "returned dtype torch.float64, expected torch.float32"),
        (f"{USER}:TupleLogits", "returned tuple, expected a tensor"),
        (f"{USER}:FailingForward", "probe batch failed with ValueError: forward fails on purpose"),
        (f"{USER}:BadSparseDim", "sparse_dim\\(5\\) must return a positive int, got 0"),
    ],
)
def test_user_model_errors(name: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        build_model(name, **LAYOUT)
    assert name in str(info.value) or "BadSparseDim" in str(info.value)


def test_user_model_unknown_option_names_allowed_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown option 'depth'.*allowed options: \['hidden'\]"):
        build_model(f"{USER}:TinyModel", **LAYOUT, depth=2)


def test_user_model_option_type_from_annotation() -> None:
    with pytest.raises(ConfigError, match=r"option 'hidden' .* must be an integer, got '8'"):
        build_model(f"{USER}:TinyModel", **LAYOUT, hidden="8")


def test_probe_shape_mentions_probe_batch() -> None:
    with pytest.raises(ConfigError, match="forward\\(dense \\[2, 3\\], sparse \\[2, 4, 5\\]\\)"):
        build_model(f"{USER}:ColumnLogits", **LAYOUT)


# ModelSpec


def test_spec_from_dict_freezes_and_round_trips() -> None:
    d = {"name": "deepfm", "options": {"deep_mlp": [16, 8], "dropout": 0.1}}
    spec = ModelSpec.from_dict(d, source="run.yaml")
    assert spec.options["deep_mlp"] == (16, 8)
    assert spec.to_dict() == d
    assert ModelSpec.from_dict(spec.to_dict()) == spec
    assert hash(spec) == hash(ModelSpec("deepfm", {"deep_mlp": (16, 8), "dropout": 0.1}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "dlrm"  # type: ignore[misc]
    with pytest.raises(TypeError):
        spec.options["dropout"] = 0.2  # type: ignore[index]
    model = spec.build(**LAYOUT)
    assert spec.sparse_dim(5) == 6
    assert model.deep[0].out_features == 16


def test_spec_pickles_and_copies() -> None:
    # Specs travel to workers inside the run config.
    spec = ModelSpec.from_dict({"name": "dlrm", "options": {"top_mlp": [8], "dropout": 0.1}})
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert copy.deepcopy(spec) == spec


def test_spec_options_may_be_left_out_or_null() -> None:
    assert ModelSpec.from_dict({"name": "dlrm"}).options == {}
    assert ModelSpec.from_dict({"name": "dlrm", "options": None}).options == {}


def test_spec_with_user_model() -> None:
    spec = ModelSpec.from_dict({"name": f"{USER}:TinyModel", "options": {"hidden": 4}})
    assert spec.build(**LAYOUT).hidden == 4


@pytest.mark.parametrize(
    ("d", "match"),
    [
        (["dlrm"], "run.yaml: model: must be a mapping"),
        ({"options": {}}, "run.yaml: model.name: missing; use one of"),
        ({"name": "dlrm", "layers": [1]}, "run.yaml: model.layers: unknown key; allowed keys"),
        ({"name": 3}, "run.yaml: model.name: must be a string, got 3"),
        ({"name": "mlp"}, "run.yaml: model.name: unknown model 'mlp'"),
        ({"name": f"{USER}:NotAModule"}, "run.yaml: model.name: .* not a torch.nn.Module"),
        ({"name": "dlrm", "options": [1]}, "run.yaml: model.options: must be a mapping"),
        ({"name": "dlrm", "options": {1: 2}}, "run.yaml: model.options: option names must be"),
        (
            {"name": "dlrm", "options": {"hidden": [8]}},
            "run.yaml: model.options.hidden: unknown option 'hidden' for model 'dlrm'; "
            "allowed options: \\['activation', 'bottom_mlp', 'dropout', 'field_projection', "
            "'top_mlp'\\]",
        ),
        (
            {"name": "dlrm", "options": {"num_fields": 3}},
            "run.yaml: model.options.num_fields: 'num_fields' is set from the data",
        ),
        (
            {"name": "dlrm", "options": {"dropout": "0.1"}},
            "run.yaml: model.options.dropout: .* must be a number, got '0.1'",
        ),
        (
            {"name": "dlrm", "options": {"dropout": 1.5}},
            "run.yaml: model.options.dropout: .* must be a number in \\[0, 1\\)",
        ),
        (
            {"name": "wide_deep", "options": {"deep_mlp": 64}},
            "run.yaml: model.options.deep_mlp: .* must be a list of integers, got 64",
        ),
        (
            {"name": "wide_deep", "options": {"deep_mlp": [64, 0]}},
            "run.yaml: model.options.deep_mlp: .* must hold positive integers",
        ),
        (
            {"name": "deepfm", "options": {"activation": "swish"}},
            "run.yaml: model.options.activation: .* must be one of \\['relu'",
        ),
        (
            {"name": f"{USER}:NeedsWidth"},
            "run.yaml: model.options: model '.*NeedsWidth' needs option\\(s\\) \\['width'\\]",
        ),
    ],
)
def test_spec_errors_name_file_and_key(d: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ModelSpec.from_dict(d, source="run.yaml")


def test_spec_errors_at_build_name_the_file() -> None:
    spec = ModelSpec.from_dict({"name": f"{USER}:ColumnLogits"}, source="run.yaml")
    with pytest.raises(ConfigError, match=r"run.yaml: model: model .* returned shape \[2, 1\]"):
        spec.build(**LAYOUT)


def test_spec_key_is_configurable() -> None:
    with pytest.raises(ConfigError, match=r"a.yaml: ctr.model.name: must be a string"):
        ModelSpec.from_dict({"name": None}, source="a.yaml", key="ctr.model")


def test_direct_construction_validates_too() -> None:
    with pytest.raises(ConfigError, match=r"ModelSpec.options.top: unknown option 'top'"):
        ModelSpec("dlrm", {"top": 1})
