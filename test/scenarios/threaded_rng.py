"""Per-rank random streams on rank threads; prints nothing, asserts in each test."""

import threading

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from distspawn import MultiThreadedTestCase, TestCase, run_tests, spawn_threads_and_init_comms


def gathered(t):
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return out


def random_sequence():
    with torch.device("cpu"):  # a function mode: draws inside it take the swapped path
        under_mode = torch.randn(2)
    return torch.cat([torch.randn(3), nn.Linear(3, 2).weight.detach().flatten(),
                      torch.empty(3).normal_(), torch.randint(0, 9, (3,)).float(),
                      torch.multinomial(torch.ones(4), 2).float(), F.dropout(torch.ones(8), 0.5),
                      torch.rand_like(torch.ones(2)), under_mode])


class PerThreadRNG(MultiThreadedTestCase):
    @property
    def world_size(self):
        return 4

    def setUp(self):
        super().setUp()
        if not hasattr(type(self), "expected_sequence"):  # drawn once, by this process
            saved = torch.get_rng_state()
            torch.manual_seed(11)
            type(self).expected_sequence = random_sequence()
            torch.set_rng_state(saved)
        self._spawn_threads()

    def test_same_seed_same_numbers_on_every_rank(self):
        torch.manual_seed(7)
        x = torch.cat([torch.randn(3), torch.rand(2), torch.randint(0, 100, (3,)).float(),
                       torch.randperm(5).float(), torch.empty(4).uniform_(),
                       torch.bernoulli(torch.full((6,), 0.5))])
        for other in gathered(x):
            self.assertEqual(other, x)
        torch.manual_seed(7)
        self.assertEqual(torch.randn(3), x[:3])  # reseeding restarts the stream

    def test_unseeded_stream_starts_like_a_rank_process(self):
        x = torch.randn(4)
        for other in gathered(x):
            self.assertEqual(other, x)

    def test_module_init_and_dropout_agree(self):
        torch.manual_seed(3)
        weight = nn.Linear(4, 4).weight.detach().flatten()
        mask = F.dropout(torch.ones(16), 0.5)
        for other in gathered(torch.cat([weight, mask])):
            self.assertEqual(other, torch.cat([weight, mask]))

    def test_draws_match_a_rank_process_with_the_same_seed(self):
        # Handed the thread's generator (randn, nn.init's uniform_, normal_,
        # randint, multinomial) or run with its state swapped in (dropout,
        # rand_like, a call under a device mode): the numbers a process gives.
        torch.manual_seed(11)
        self.assertEqual(random_sequence(), type(self).expected_sequence)

    def test_rng_state_round_trip_is_per_thread(self):
        state = torch.get_rng_state()
        first = torch.randn(3)
        dist.barrier()
        torch.set_rng_state(state)
        self.assertEqual(torch.randn(3), first)


def noisy(x):
    return F.dropout(torch.randn(4) + x, 0.5) + torch.empty(4).uniform_()


def noisy_too(x):
    return torch.rand_like(x) + torch.randn(4)


class CompileInRankThreads(MultiThreadedTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        type(self).compiled = threading.Event()
        self._spawn_threads()

    def test_eager_draws_stay_per_rank_while_another_rank_compiles(self):
        if self.rank == 0:
            try:
                torch.compile(noisy_too, backend="eager", fullgraph=True)(torch.zeros(4))
            finally:
                self.compiled.set()
            return
        expected = torch.randn(3, generator=torch.Generator().manual_seed(5))
        draws = 0
        while not self.compiled.is_set() or draws == 0:
            torch.manual_seed(5)
            self.assertEqual(torch.randn(3), expected, f"draw {draws}")
            draws += 1

    def test_compiled_random_ops_trace_and_eager_ones_stay_per_rank(self):
        # fullgraph: the random-function wrappers must not break the graph
        compiled = torch.compile(noisy, backend="eager", fullgraph=True)
        self.assertEqual(compiled(torch.zeros(4)).shape, (4,))
        torch.manual_seed(5)
        x = torch.randn(3)
        for other in gathered(x):
            self.assertEqual(other, x)


class CompileOnceThreadedTestsEnded(TestCase):
    def test_compile_still_knows_the_random_functions(self):
        # Runs after CompileInRankThreads (by name), whose compile was this
        # process's first: the tables torch.compile filled then must name
        # torch's own functions, not the wrappers.
        import torch._dynamo

        torch._dynamo.reset()
        compiled = torch.compile(noisy, backend="eager", fullgraph=True)
        self.assertEqual(compiled(torch.zeros(4)).shape, (4,))
        compiled = torch.compile(lambda t: torch.Tensor.uniform_(t), backend="eager",
                                 fullgraph=True)
        self.assertEqual(compiled(torch.empty(4)).shape, (4,))


class SharedRNG(MultiThreadedTestCase):
    per_thread_rng = False

    @property
    def world_size(self):
        return 4

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def test_ranks_draw_from_one_generator(self):
        dist.barrier()
        x = torch.randn(8)
        values = gathered(x)
        self.assertTrue(any(not torch.equal(values[0], v) for v in values[1:]),
                        "threads sharing one generator drew identical numbers")


class Decorated(TestCase):
    @spawn_threads_and_init_comms(world_size=3)
    def test_decorated_ranks_agree(self):
        torch.manual_seed(11)
        x = torch.randn(5)
        for other in gathered(x):
            self.assertEqual(other, x)


if __name__ == "__main__":
    run_tests()
