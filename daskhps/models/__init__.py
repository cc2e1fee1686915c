"""PyTorch dense CTR models: DLRM, DeepFM, Wide & Deep, DCN-v2, and a user's own nn.Module.

Models see pooled embedding rows looked up in the sharded table, never an ``nn.Embedding`` of
their own, and never import dask. See :mod:`daskhps.models.base` for the batch layout.
"""

from __future__ import annotations

from daskhps.models.base import CTRModel, InputLayout
from daskhps.models.dcn import DCNv2
from daskhps.models.deepfm import DeepFM
from daskhps.models.dlrm import DLRM
from daskhps.models.layers import split_fields
from daskhps.models.options import model_options
from daskhps.models.pooling import pool
from daskhps.models.registry import BUILTIN_MODELS, build_model, resolve_model, sparse_dim_of
from daskhps.models.spec import ModelSpec
from daskhps.models.wide_deep import WideDeep

__all__ = [
    "BUILTIN_MODELS",
    "DLRM",
    "CTRModel",
    "DCNv2",
    "DeepFM",
    "InputLayout",
    "ModelSpec",
    "WideDeep",
    "build_model",
    "model_options",
    "pool",
    "resolve_model",
    "sparse_dim_of",
    "split_fields",
]
