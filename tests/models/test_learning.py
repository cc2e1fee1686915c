"""Each built-in model learns a tiny synthetic problem: held-out AUC and training loss."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from daskhps.models import BUILTIN_MODELS, build_model
from tests.models.helpers import NUM_DENSE, NUM_FIELDS, TableAndModel, auc, make_batch, make_truth

STEPS = 300
BATCH = 256


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    # Tiny matmuls gain nothing from intra-op threads, and threads fighting other processes
    # for the cores made these tests several times slower on a busy machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", sorted(BUILTIN_MODELS))
def test_model_learns_synthetic_problem(name: str) -> None:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    truth = make_truth(gen)
    test = make_batch(2048, gen, truth)
    model = build_model(name, num_dense=NUM_DENSE, num_fields=NUM_FIELDS, embedding_dim=8)
    net = TableAndModel(model, embedding_dim=8)
    opt = torch.optim.Adam(net.parameters(), lr=0.01)

    with torch.no_grad():
        auc_before = auc(net(test), test.labels)
        loss_before = F.binary_cross_entropy_with_logits(net(test), test.labels).item()
    for _ in range(STEPS):
        batch = make_batch(BATCH, gen, truth)
        loss = F.binary_cross_entropy_with_logits(net(batch), batch.labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        auc_after = auc(net(test), test.labels)
        loss_after = F.binary_cross_entropy_with_logits(net(test), test.labels).item()

    assert auc_after > 0.9, (auc_before, auc_after)
    assert loss_after < 0.6 * loss_before, (loss_before, loss_after)
