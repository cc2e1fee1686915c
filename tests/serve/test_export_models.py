"""Every built-in model exports to TorchScript the way ``daskhps export`` does it (a trace,
checked on a second batch size), and the saved module gives the eager model's logits on a
third batch size after a save and load. No training run: the models are built fresh."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from daskhps.models import BUILTIN_MODELS, build_model
from daskhps.serve.export import _quiet_jit, _trace

CASES = [(name, {}) for name in sorted(BUILTIN_MODELS)] + [
    ("dcnv2", {"structure": "parallel", "low_rank": 3}),
    ("dcnv2", {"deep_mlp": [], "cross_layers": 1}),
    ("dlrm", {"dropout": 0.2}),  # exported in eval mode: dropout is off in the trace
]


@pytest.mark.parametrize(("name", "options"), CASES, ids=[f"{n}-{o}" for n, o in CASES])
@pytest.mark.parametrize("num_dense", [0, 4])
def test_builtin_model_exports_to_torchscript(
    tmp_path: Path, name: str, options: dict[str, object], num_dense: int
) -> None:
    torch.manual_seed(0)
    model = build_model(name, num_dense=num_dense, num_fields=5, embedding_dim=6, **options)
    model.eval()  # as Servable.build_model hands it to the export
    width = model.sparse_dim(6)
    traced = _trace(model, num_dense, (5, width))
    path = tmp_path / "model.pt"
    with _quiet_jit():
        torch.jit.save(traced, str(path))
        loaded = torch.jit.load(str(path))
    gen = torch.Generator().manual_seed(1)
    dense, sparse = (
        torch.randn(5, num_dense, generator=gen),
        torch.randn(5, 5, width, generator=gen),
    )
    with torch.no_grad():
        want = model(dense, sparse)
        got = loaded(dense, sparse)
    assert got.shape == (5,) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(BUILTIN_MODELS))
@pytest.mark.parametrize("num_dense", [0, 4])
def test_builtin_model_with_unequal_widths_exports_to_torchscript(
    tmp_path: Path, name: str, num_dense: int
) -> None:
    # The flat sparse input of fields of unequal widths, traced by the export's _trace (one
    # batch size, checked on another), compared with the eager model on a third after a save
    # and load.
    dims = (3, 6, 1, 6, 4)
    torch.manual_seed(0)
    model = build_model(
        name, num_dense=num_dense, num_fields=len(dims), embedding_dim=6, field_dims=dims
    )
    model.eval()
    width = sum(model.sparse_dim(d) for d in dims)
    gen = torch.Generator().manual_seed(0)

    def example(b: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(b, num_dense, generator=gen), torch.randn(b, width, generator=gen)

    path = tmp_path / "model.pt"
    traced = _trace(model, num_dense, (width,))
    with _quiet_jit():
        torch.jit.save(traced, str(path))
        loaded = torch.jit.load(str(path))
    dense, sparse = example(5)
    with torch.no_grad():
        want = model(dense, sparse)
        got = loaded(dense, sparse)
    assert got.shape == (5,) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
