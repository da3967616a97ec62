"""FSDP2 tests in the shapes real projects write them (torchtitan, torchao, ...).

UPSTREAM_HARNESS=1 runs this file on upstream's common_fsdp; otherwise on
distspawn.fsdp. Upstream skips every FSDPTest without a GPU; distspawn runs
them on CPU with gloo.
"""

import copy
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

if os.environ.get("UPSTREAM_HARNESS") == "1":
    from torch.testing._internal.common_distributed import skip_if_lt_x_gpu
    from torch.testing._internal.common_fsdp import (
        MLP,
        FSDPTest,
        FSDPTestContinuous,
        FSDPTestMultiThread,
        check_sharded_parity,
        compiled_fsdp_test,
        patch_reduce_scatter,
        reduce_scatter_with_assert,
    )
    from torch.testing._internal.common_utils import run_tests
else:
    from distspawn import run_tests, skip_if_lt_x_gpu
    from distspawn.fsdp import (
        MLP,
        FSDPTest,
        FSDPTestContinuous,
        FSDPTestMultiThread,
        check_sharded_parity,
        compiled_fsdp_test,
        patch_reduce_scatter,
        reduce_scatter_with_assert,
    )


def train_both(case, reference, model, steps=3):
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(case.rank + 10)
    for _ in range(steps):
        x = torch.randn(4, 8, generator=generator)
        loss = model(x).sum()
        loss.backward()
        ref_loss = reference(x).sum()
        ref_loss.backward()
        for param in reference.parameters():  # the gradient DDP would have
            dist.all_reduce(param.grad)
            param.grad /= case.world_size
        case.assertEqual(loss, ref_loss)
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()


class FullyShardOnRanks(FSDPTest):
    def test_fully_shard_matches_replicated_training(self):
        torch.manual_seed(0)
        reference = MLP(8)
        model = copy.deepcopy(reference)
        fully_shard(model.in_proj)
        fully_shard(model)
        check_sharded_parity(self, reference, model)
        train_both(self, reference, model)
        check_sharded_parity(self, reference, model)

    def test_reduce_scatter_sees_the_unsharded_gradient(self):
        torch.manual_seed(0)
        model = fully_shard(MLP(8))
        seen = []

        def check(output):
            seen.append(tuple(output.shape))

        original = dist.reduce_scatter_tensor
        with patch_reduce_scatter(
                lambda *a, **k: reduce_scatter_with_assert(self, original, check, *a, **k)):
            model(torch.randn(2, 8)).sum().backward()
        self.assertTrue(seen)

    def test_rank_1_fails(self):
        if self.rank == 1:
            raise AssertionError("rank 1 saw a wrong shard")

    @skip_if_lt_x_gpu(2)
    def test_needs_two_gpus(self):
        pass


class FullyShardOnReusedRanks(FSDPTestContinuous):
    def test_fully_shard_matches_replicated_training_on_reused_ranks(self):
        torch.manual_seed(0)
        reference = MLP(8)
        model = copy.deepcopy(reference)
        fully_shard(model)
        train_both(self, reference, model)
        check_sharded_parity(self, reference, model)


class CompiledOrNot(FSDPTest):
    runs = 0

    @compiled_fsdp_test(compile_compute_on_module=MLP)
    def test_eager_run_always_happens(self):
        type(self).runs += 1
        model = fully_shard(MLP(8))
        model(torch.randn(2, 8)).sum().backward()
        if not torch.cuda.is_available():  # no Triton for the CPU: eager only
            self.assertEqual(type(self).runs, 1)


class FullyShardOnThreads(FSDPTestMultiThread):
    @property
    def world_size(self):
        return 2

    def test_world_on_threads(self):
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), float(self.world_size))


if __name__ == "__main__":
    sys.exit(run_tests())
