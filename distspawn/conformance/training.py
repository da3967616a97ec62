"""Training on several ranks: DistributedDataParallel, SyncBatchNorm, DistributedSampler
and model averaging, each checked against a single-process reference."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

from ..cases.dist_backend import require_backend_feature
from ..fixtures.optional import torchvision_problem

_BATCH_PER_RANK = 4


def _model() -> nn.Module:
    torch.manual_seed(1234)  # the same initial weights on every rank and in the reference
    return nn.Sequential(nn.Linear(6, 10), nn.ReLU(), nn.Linear(10, 3))


def _global_batch(step: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 + step)
    inputs = torch.randn(world * _BATCH_PER_RANK, 6, generator=generator)
    return inputs, torch.randn(world * _BATCH_PER_RANK, 3, generator=generator)


def _my_chunk(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    rank = dist.get_rank()
    inputs, targets = batch
    rows = slice(rank * _BATCH_PER_RANK, (rank + 1) * _BATCH_PER_RANK)
    return inputs[rows], targets[rows]


def _vision_model() -> nn.Module:
    import torchvision

    torch.manual_seed(1234)
    # GroupNorm instead of BatchNorm: each sample's output depends on that sample
    # alone, so per-rank gradients average to those of the whole batch.
    return torchvision.models.resnet18(num_classes=3, norm_layer=lambda c: nn.GroupNorm(1, c))


def _vision_batch(step: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(2000 + step)
    images = torch.randn(world * _BATCH_PER_RANK, 3, 32, 32, generator=generator)
    return images, torch.randn(world * _BATCH_PER_RANK, 3, generator=generator)


def _need_torchvision(test) -> None:
    # Asked when the test runs, not at import: importing torchvision costs
    # every test process time, and a broken one must only skip these tests.
    problem = torchvision_problem()
    if problem is not None:
        test.skipTest(problem)


def _loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, targets = batch
    return F.mse_loss(model(inputs), targets)


class _TwoBranches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(99)
        self.used = nn.Linear(6, 3)
        self.unused = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


class DDPTests:
    """DistributedDataParallel on CPU: gradients equal to one process on the whole batch."""

    def _train_and_compare(self, steps: int = 3, model=_model, batches=_global_batch,
                           atol: float = 1e-5, rtol: float = 1e-4, **ddp_kwargs) -> DDP:
        world = dist.get_world_size()
        reference = model()
        ddp = DDP(model(), **ddp_kwargs)
        optimizers = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (reference, ddp)]
        for step in range(steps):
            batch = batches(step, world)
            for optimizer in optimizers:
                optimizer.zero_grad()
            _loss(reference, batch).backward()
            _loss(ddp, _my_chunk(batch)).backward()
            for mine, want in zip(ddp.parameters(), reference.parameters()):
                self.assertEqual(mine.grad, want.grad, atol=atol, rtol=rtol)
            for optimizer in optimizers:
                optimizer.step()
        for mine, want in zip(ddp.module.parameters(), reference.parameters()):
            self.assertEqual(mine, want, atol=atol, rtol=rtol)
        return ddp

    def test_ddp_gradients_match_a_single_process(self):
        self._train_and_compare()

    def test_ddp_static_graph(self):
        self._train_and_compare(steps=4, static_graph=True)

    def test_ddp_torchvision_resnet_matches_a_single_process(self):
        _need_torchvision(self)
        self._train_and_compare(steps=2, model=_vision_model, batches=_vision_batch,
                                atol=1e-4, rtol=1e-3)

    def test_ddp_gradient_as_bucket_view(self):
        self._train_and_compare(gradient_as_bucket_view=True)

    def test_ddp_small_buckets(self):
        self._train_and_compare(bucket_cap_mb=0.0001)  # one bucket per parameter

    def test_ddp_allreduce_comm_hook_matches_the_default(self):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        world = dist.get_world_size()
        reference, ddp = _model(), DDP(_model())
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        batch = _global_batch(0, world)
        _loss(reference, batch).backward()
        _loss(ddp, _my_chunk(batch)).backward()
        for mine, want in zip(ddp.parameters(), reference.parameters()):
            self.assertEqual(mine.grad, want.grad, atol=1e-5, rtol=1e-4)

    def test_ddp_fp16_compress_hook_is_close(self):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        world = dist.get_world_size()
        reference, ddp = _model(), DDP(_model())
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        batch = _global_batch(0, world)
        _loss(reference, batch).backward()
        _loss(ddp, _my_chunk(batch)).backward()
        for mine, want in zip(ddp.parameters(), reference.parameters()):
            self.assertEqual(mine.grad, want.grad, atol=2e-3, rtol=1e-2)

    def test_ddp_custom_comm_hook_sees_and_sets_buckets(self):
        # A hook that sums without dividing: gradients come out world-size times larger.
        def sum_hook(state, bucket):
            tensor = bucket.buffer()
            return dist.all_reduce(tensor, async_op=True).get_future().then(
                lambda fut: fut.value()[0])

        world = dist.get_world_size()
        reference, ddp = _model(), DDP(_model())
        ddp.register_comm_hook(None, sum_hook)
        batch = _global_batch(0, world)
        _loss(reference, batch).backward()
        _loss(ddp, _my_chunk(batch)).backward()
        for mine, want in zip(ddp.parameters(), reference.parameters()):
            self.assertEqual(mine.grad, want.grad * world, atol=1e-4, rtol=1e-4)

    def test_ddp_no_sync_accumulates_then_syncs(self):
        world = dist.get_world_size()
        reference, ddp = _model(), DDP(_model())
        first, second = _global_batch(0, world), _global_batch(1, world)
        with ddp.no_sync():
            _loss(ddp, _my_chunk(first)).backward()
        # Inside no_sync gradients are this rank's own: they differ between ranks.
        local = next(ddp.parameters()).grad.clone()
        gathered = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(gathered, local)
        if world > 1:
            self.assertFalse(all(torch.equal(g, gathered[0]) for g in gathered))
        _loss(ddp, _my_chunk(second)).backward()
        _loss(reference, first).backward()
        _loss(reference, second).backward()
        for mine, want in zip(ddp.parameters(), reference.parameters()):
            self.assertEqual(mine.grad, want.grad, atol=1e-5, rtol=1e-4)

    def test_ddp_find_unused_parameters(self):
        world = dist.get_world_size()
        reference, ddp = _TwoBranches(), DDP(_TwoBranches(), find_unused_parameters=True)
        for step in range(2):  # a second step fails if the first left a reduction pending
            for model in (reference, ddp):
                model.zero_grad()
            batch = _global_batch(step, world)
            _loss(reference, batch).backward()
            _loss(ddp, _my_chunk(batch)).backward()
            for mine, want in zip(ddp.module.used.parameters(), reference.used.parameters()):
                self.assertEqual(mine.grad, want.grad, atol=1e-5, rtol=1e-4)
            for param in ddp.module.unused.parameters():
                self.assertTrue(param.grad is None or not param.grad.any())

    def test_ddp_broadcasts_parameters_and_buffers_from_rank_0(self):
        torch.manual_seed(dist.get_rank())  # different weights and buffers on every rank
        module = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
        module[1].running_mean.fill_(float(dist.get_rank()))
        ddp = DDP(module)
        state = [t.detach().clone() for t in list(ddp.module.parameters())
                 + list(ddp.module.buffers())]
        for tensor in state:
            from_zero = tensor.clone()
            dist.broadcast(from_zero, 0)
            self.assertEqual(tensor, from_zero)
        self.assertEqual(ddp.module[1].running_mean, torch.zeros(4))

    def test_ddp_uneven_inputs_with_join(self):
        world, rank = dist.get_world_size(), dist.get_rank()
        ddp = DDP(_model())
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
        with ddp.join():
            for step in range(2 + rank):  # rank r has r more batches than rank 0
                optimizer.zero_grad()
                _loss(ddp, _my_chunk(_global_batch(step, world))).backward()
                optimizer.step()
        for param in ddp.parameters():
            gathered = [torch.empty_like(param) for _ in range(world)]
            dist.all_gather(gathered, param.detach())
            for other in gathered:
                self.assertEqual(other, param.detach())

    def test_ddp_state_dict_loads_into_a_plain_module(self):
        ddp = self._train_and_compare(steps=1)
        plain = _model()
        plain.load_state_dict(ddp.module.state_dict())
        batch = _my_chunk(_global_batch(5, dist.get_world_size()))
        self.assertEqual(plain(batch[0]), ddp(batch[0]))


for _name, _test in list(vars(DDPTests).items()):
    if _name.startswith("test_"):  # every DDP test needs a backend DDP supports
        setattr(DDPTests, _name, require_backend_feature("ddp")(_test))
del _name, _test


class DataTests:
    """SyncBatchNorm, DistributedSampler and model averaging."""

    def test_convert_sync_batchnorm_keeps_state(self):
        module = nn.Sequential(nn.Conv1d(2, 4, 1), nn.BatchNorm1d(4),
                               nn.Sequential(nn.BatchNorm1d(4)))
        module[1].running_mean.fill_(3.0)
        converted = nn.SyncBatchNorm.convert_sync_batchnorm(module)
        self.assertIsInstance(converted[1], nn.SyncBatchNorm)
        self.assertIsInstance(converted[2][0], nn.SyncBatchNorm)
        self.assertEqual(converted[1].running_mean, torch.full((4,), 3.0))

    def test_convert_sync_batchnorm_gives_nested_torchvision_layers_the_group(self):
        _need_torchvision(self)
        import torchvision

        group = dist.new_group([0])
        converted = nn.SyncBatchNorm.convert_sync_batchnorm(torchvision.models.resnet18(), group)
        layers = [m for m in converted.modules() if isinstance(m, nn.SyncBatchNorm)]
        self.assertEqual(len(layers), 20)  # every BatchNorm2d of resnet18, however deep
        self.assertTrue(all(layer.process_group is group for layer in layers))
        self.assertFalse(any(isinstance(m, nn.BatchNorm2d) and not isinstance(m, nn.SyncBatchNorm)
                             for m in converted.modules()))

    def test_sync_batchnorm_matches_batchnorm_on_the_whole_batch(self):
        world = dist.get_world_size()
        if torch.cuda.device_count() < world:
            self.skipTest("SyncBatchNorm runs only on accelerator tensors: needs one GPU "
                          f"per rank ({world})")
        device = torch.device("cuda", dist.get_rank())
        generator = torch.Generator().manual_seed(7)
        whole = torch.randn(world * 4, 3, generator=generator)
        reference = nn.BatchNorm1d(3)
        want = reference(whole)
        sync = nn.SyncBatchNorm(3).to(device)
        mine = whole[dist.get_rank() * 4:(dist.get_rank() + 1) * 4].to(device)
        got = sync(mine)
        self.assertEqual(got.cpu(), want[dist.get_rank() * 4:(dist.get_rank() + 1) * 4],
                         atol=1e-5, rtol=1e-4)
        self.assertEqual(sync.running_mean.cpu(), reference.running_mean, atol=1e-5, rtol=1e-4)

    def _sampled(self, size: int, **kwargs) -> list[list[int]]:
        world, rank = dist.get_world_size(), dist.get_rank()
        sampler = DistributedSampler(range(size), num_replicas=world, rank=rank, **kwargs)
        gathered = [None] * world
        dist.all_gather_object(gathered, list(sampler))
        self.assertEqual(len(gathered[rank]), len(sampler))
        return gathered

    def test_distributed_sampler_partitions_the_dataset(self):
        world = dist.get_world_size()
        size = 6 * world
        parts = self._sampled(size, shuffle=False)
        flat = [index for part in parts for index in part]
        self.assertEqual(sorted(flat), list(range(size)))  # disjoint and complete

    def test_distributed_sampler_pads_or_drops_the_remainder(self):
        world = dist.get_world_size()
        size = 5 * world + 1
        padded = self._sampled(size, shuffle=False)
        self.assertTrue(all(len(part) == 6 for part in padded))
        self.assertEqual(set(i for part in padded for i in part), set(range(size)))
        dropped = self._sampled(size, shuffle=False, drop_last=True)
        self.assertTrue(all(len(part) == 5 for part in dropped))
        flat = [i for part in dropped for i in part]
        self.assertEqual(len(set(flat)), len(flat))

    def test_distributed_sampler_shuffles_consistently_per_epoch(self):
        world, rank = dist.get_world_size(), dist.get_rank()
        size = 8 * world
        sampler = DistributedSampler(range(size), num_replicas=world, rank=rank, seed=3)
        orders = []
        for epoch in (0, 1):
            sampler.set_epoch(epoch)
            gathered = [None] * world
            dist.all_gather_object(gathered, list(sampler))
            self.assertEqual(sorted(i for part in gathered for i in part), list(range(size)))
            orders.append(gathered)
        self.assertNotEqual(orders[0], orders[1])

    def test_average_parameters(self):
        from torch.distributed.algorithms.model_averaging import utils

        world = dist.get_world_size()
        params = [nn.Parameter(torch.full((3,), float(dist.get_rank()))),
                  nn.Parameter(torch.full((2, 2), float(dist.get_rank()) * 2))]
        utils.average_parameters(iter(params), dist.group.WORLD)
        mean = sum(range(world)) / world
        self.assertEqual(params[0].detach(), torch.full((3,), mean))
        self.assertEqual(params[1].detach(), torch.full((2, 2), 2 * mean))

    def test_periodic_model_averager_averages_only_on_its_period(self):
        from torch.distributed.algorithms.model_averaging import averagers

        world, rank = dist.get_world_size(), dist.get_rank()
        mean = sum(range(world)) / world
        param = nn.Parameter(torch.full((2,), float(rank)))
        param.grad = torch.zeros_like(param)  # the averager skips parameters with no grad
        averager = averagers.PeriodicModelAverager(period=2, warmup_steps=1)
        averaged_at = []
        for step in range(4):
            with torch.no_grad():
                param.add_(rank + 1.0)  # ranks drift apart between averagings
            averager.average_parameters([param])
            values = [None] * world
            dist.all_gather_object(values, param.detach()[0].item())
            if len(set(values)) == 1:
                averaged_at.append(step)
        # Averaged at steps 1 and 3 (warm-up 1, then every 2nd step); rank r holds
        # r + 4 * (r + 1) before the last averaging, so 5 * mean + 4 after it.
        self.assertEqual(averaged_at, [0, 1, 2, 3] if world == 1 else [1, 3])
        self.assertEqual(param.detach(), torch.full((2,), 5 * mean + 4.0))

    def test_average_parameters_on_a_copy_leaves_the_original(self):
        from torch.distributed.algorithms.model_averaging import utils

        model = _model()
        with torch.no_grad():
            for param in model.parameters():
                param.add_(float(dist.get_rank()))
        untouched = copy.deepcopy(model)
        utils.average_parameters(iter(model.parameters()), dist.group.WORLD)
        mean = sum(range(dist.get_world_size())) / dist.get_world_size()
        for averaged, before in zip(model.parameters(), untouched.parameters()):
            self.assertEqual(averaged, before - dist.get_rank() + mean, atol=1e-5, rtol=1e-5)
