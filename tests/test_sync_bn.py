"""--sync-bn's hook (runtime/dist/sync_bn.py) over BatchNorm forms nobody picked for demo:cnn: BatchNorm1d on
(N, C) and (N, C, L), 2d without running statistics (track_running_stats=False captures another op), 3d, two in a
row, and affine=False (no weight, no bias), each with a conv or linear before it so the input gradient crosses the
backward's all-reduced sums. Two ranks of unequal rows run their captured gradient steps concurrently (threads:
the hook all-reduces mid-step, so they must meet), joined by a host sum; their rows-weighted loss and gradients
must equal torch's eager backward on the whole batch, as torch's SyncBatchNorm gives. (momentum=None, the
cumulative average, is not in the list: its num_batches_tracked.item() fails the training capture itself, with or
without --sync-bn.)"""
import threading

import pytest
import torch
from torch import nn

from opscope.runtime import backends
from opscope.runtime.dist.split import GradientStep
from opscope.runtime.dist.sync_bn import SyncBatchNorm, has_batch_norm
from opscope.runtime.train.joint import capture_joint
from opscope.runtime.train.step import OptimizerSpec, build_train_graph

ROWS = [6, 2]


class Net(nn.Module):
    def __init__(self, body: nn.Module, norm: nn.Module, features: int):
        super().__init__()
        self.body, self.norm, self.head = body, norm, nn.Linear(features, 3)

    def forward(self, x, target):
        h = torch.relu(self.norm(self.body(x)))
        return ((self.head(h.flatten(1)) - target) ** 2).mean()


CASES = {
    "BatchNorm1d (N, C)": lambda: (Net(nn.Linear(5, 4), nn.BatchNorm1d(4), 4), (8, 5)),
    "BatchNorm1d (N, C, L), affine=False": lambda: (Net(nn.Conv1d(2, 4, 3), nn.BatchNorm1d(4, affine=False), 20),
                                                    (8, 2, 7)),
    "BatchNorm2d, track_running_stats=False": lambda: (
        Net(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3, track_running_stats=False), 48), (8, 2, 6, 6)),
    "two BatchNorm2d in a row": lambda: (
        Net(nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.Conv2d(3, 3, 1)), nn.BatchNorm2d(3), 48),
        (8, 2, 6, 6)),
    "BatchNorm3d": lambda: (Net(nn.Conv3d(2, 3, 2), nn.BatchNorm3d(3), 81), (8, 2, 4, 4, 4)),
}


class ThreadSum:
    """all_reduce for ranks that are threads of this process: every rank's tensor summed, in place."""

    def __init__(self, world: int):
        self.slots = [None] * world
        self.barrier = threading.Barrier(world, timeout=120)

    def for_rank(self, rank: int):
        def all_reduce(t: torch.Tensor) -> None:
            self.slots[rank] = t
            self.barrier.wait()
            total = sum(s.clone() for s in self.slots)
            self.barrier.wait()          # every rank has read every slot before any is overwritten
            t.copy_(total)
        return all_reduce


def _ranks_step(model, batch):
    """(rows-weighted loss, rows-weighted gradients) of len(ROWS) ranks stepping together with the hook."""
    cpu, opt, world = backends.resolve("torch:cpu"), OptimizerSpec(), len(ROWS)
    comm, results, errors = ThreadSum(world), [None] * world, []
    steps = []
    for r in range(world):
        start = sum(ROWS[:r])
        local = tuple(x[start:start + ROWS[r]] for x in batch)
        steps.append((GradientStep(build_train_graph(capture_joint(model, local, "sync-bn"), opt), cpu), local))

    def run(r):
        step, local = steps[r]
        try:
            with step.executor.hooked(SyncBatchNorm(ROWS[r] / sum(ROWS), comm.for_rank(r))):
                results[r] = step.run(local)
        except BaseException as e:      # noqa: BLE001 -- said by the test's thread, raised below
            errors.append(e)
            comm.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    w = [n / sum(ROWS) for n in ROWS]
    loss = sum(wi * res[0] for wi, res in zip(w, results))
    grads = {name: sum(wi * torch.from_numpy(res[1][name]).double() for wi, res in zip(w, results))
             for name in results[0][1]}
    return loss, grads


@pytest.mark.parametrize("case", list(CASES))
def test_ranks_with_sync_bn_match_torch_on_the_whole_batch(case):
    torch.manual_seed(0)
    model, shape = CASES[case]()
    batch = (torch.randn(*shape) * 3 + 1, torch.randn(shape[0], 3))
    loss, grads = _ranks_step(model.train(), batch)
    model.zero_grad()
    want = model(*batch)
    want.backward()
    assert loss == pytest.approx(want.item(), abs=1e-5)
    named = dict(model.named_parameters())
    assert grads and set(grads) <= set(named)
    for name, g in grads.items():
        torch.testing.assert_close(g, named[name].grad.double(), atol=1e-5, rtol=1e-4, msg=f"{case}: {name}")


def test_the_hook_is_installed_only_on_a_step_with_a_batch_norm():
    """Under a hook the executor calls it after every op: a step without BatchNorm does not get one."""
    cpu, opt = backends.resolve("torch:cpu"), OptimizerSpec()
    model, shape = CASES["BatchNorm3d"]()
    batch = (torch.randn(*shape), torch.randn(shape[0], 3))
    with_bn = GradientStep(build_train_graph(capture_joint(model.train(), batch, "bn"), opt), cpu)
    model.norm = nn.Identity()
    without = GradientStep(build_train_graph(capture_joint(model, batch, "no-bn"), opt), cpu)
    assert has_batch_norm(with_bn.plan) and not has_batch_norm(without.plan)
