"""Two-process gloo tests: add-ons gathered over ranks equal the one-process run on the batch.

All ranks compute the same global loss; the gather's backward sums their gradients, so a rank's
rows get ``world_size`` times their single-process gradient, and DDP's averaging of parameter
gradients gives exactly the single-process parameter gradient. Both facts are checked.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from e2mc.addons import build_addon
from helpers import free_port

WORLD = 2
N, D_IN, D = 32, 6, 12
CASES = {
    "e2mc": dict(space="hypercube", beta=2.0, gamma=3.0),
    "e2mc-sphere": dict(space="hypersphere", beta=1.0, gamma=25.0, view_reduction="sum"),
    "vcreg": dict(),
    "uniformity": dict(),
    "mmcr": dict(lam=0.1),
    "sigreg": dict(weight=1.0, num_slices=32),
}
VIEWS = {"mmcr": 4}


def addon_for(case: str):
    return build_addon(case.split("-")[0], **CASES[case])


def global_data(case: str) -> tuple[list[torch.Tensor], torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    xs = [torch.randn(N, D_IN, dtype=torch.float64, generator=g) for _ in range(VIEWS.get(case, 2))]
    weight = torch.randn(D, D_IN, dtype=torch.float64, generator=g)
    return xs, weight


def run_case(case: str, rows: slice, ddp: bool, seed: int = 0) -> dict[str, torch.Tensor]:
    """Loss, embedding gradients of the given rows and the linear encoder's weight gradient.
    ``seed``: the run's seed when the add-on is built (SIGReg's directions); rank 1 runs with
    another one than rank 0 and the one process, so only rank 0's broadcast seed makes the
    ranks draw the one process's directions."""
    torch.manual_seed(seed)
    xs, weight = global_data(case)
    encoder = nn.Linear(D_IN, D, bias=False).double()
    with torch.no_grad():
        encoder.weight.copy_(weight)
    model = nn.parallel.DistributedDataParallel(encoder) if ddp else encoder
    zs = [model(x[rows]) for x in xs]
    for z in zs:
        z.retain_grad()
    loss = addon_for(case)(zs)["loss"]
    loss.backward()
    return {
        "loss": loss.detach(),
        "z_grads": torch.stack([z.grad for z in zs]),
        "weight_grad": encoder.weight.grad.clone(),
    }


def worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        half = N // WORLD
        rows = slice(rank * half, (rank + 1) * half)
        results = {case: run_case(case, rows, ddp=True, seed=rank) for case in CASES}
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
        dist.barrier()  # neither rank tears gloo down while the other still talks to it
    finally:
        dist.destroy_process_group()
    # Done and saved: leave without the interpreter's teardown, in which gloo's threads abort
    # the process now and then ("terminate called without an active exception", SIGABRT),
    # which mp.spawn reports as a failure of a worker whose results are complete.
    os._exit(0)



@pytest.fixture(scope="module")
def two_process_results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("gloo")
    mp.spawn(worker, args=(free_port(), str(out)), nprocs=WORLD, join=True)
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]


@pytest.mark.parametrize("case", list(CASES))
def test_gathered_addon_equals_single_process(case: str, two_process_results: list[dict]) -> None:
    full = run_case(case, slice(None), ddp=False)
    half = N // WORLD
    for rank, results in enumerate(two_process_results):
        got = results[case]
        torch.testing.assert_close(got["loss"], full["loss"], rtol=0, atol=1e-6)
        rows = full["z_grads"][:, rank * half : (rank + 1) * half]
        torch.testing.assert_close(got["z_grads"], WORLD * rows, rtol=0, atol=1e-6)
        torch.testing.assert_close(got["weight_grad"], full["weight_grad"], rtol=0, atol=1e-6)


def test_without_gather_ranks_see_only_their_rows(two_process_results: list[dict]) -> None:
    # Sanity check that the test can fail: the local (ungathered) loss differs from the global.
    xs, weight = global_data("e2mc")
    local = build_addon("e2mc", gather=False, **CASES["e2mc"])
    z = [x[: N // WORLD] @ weight.T for x in xs]
    assert abs(local(z)["loss"].item() - two_process_results[0]["e2mc"]["loss"].item()) > 1e-3
