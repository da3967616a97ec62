"""MultiThreadedTestCase and spawn_threads_and_init_comms: verdicts and messages.

scenarios/threaded_faults.py holds one test per case and runs once, in a
subprocess, with a 4 s deadline; each test here reads its case from that run.
"""

import re
import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from distspawn import MultiThreadedTestCase, threaded_world
from distspawn.backends.threaded_pg import CollectiveTimeoutError, active_session
from harness import run_python, needs_gpus


@pytest.fixture(scope="module")
def faults():
    return run_python(["threaded_faults.py", "-v"],
                      env={"DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": "4"}, timeout=120)


def _run_seconds(run):
    return float(re.search(r"Ran \d+ tests in ([\d.]+)s", run.output).group(1))


def test_run_fails_overall_and_leaves_nothing(faults):
    assert faults.returncode == 1, faults.output
    assert faults.leftover_files == []
    assert faults.leftover_pids == []
    # 21 tests, two of them wait for a deadline (4 s and 2 s): nothing else may wait.
    assert _run_seconds(faults) < 30, faults.output


def test_pass(faults):
    assert faults.verdict_line("test_pass").endswith("... ok")


def test_exception_names_rank_and_traceback(faults):
    report = faults.report("test_exception_on_rank1")
    assert "1 of 4 ranks failed (rank 1)" in report
    assert "rank 1: raised an exception" in report
    assert "ValueError: boom on rank 1" in report
    assert 'threaded_faults.py", line' in report
    assert "ranks 0, 2, 3: still running when the failure was known; ended by distspawn" in report


def test_exception_stops_busy_peers(faults):
    # The other ranks loop forever; the verdict must not wait for the deadline.
    report = faults.report("test_exception_while_peers_compute")
    assert "RuntimeError: rank 0 broke while the others compute" in report
    assert "(deadline" not in report
    assert "ranks 1, 2, 3: still running when the failure was known" in report


@pytest.mark.parametrize("test, lines", [
    ("test_shape_mismatch", ["rank 0: all_reduce(op=SUM, [float32[4]])",
                             "rank 2: all_reduce(op=SUM, [float32[5]])"]),
    ("test_op_mismatch", ["rank 0: all_reduce(op=SUM, [float32[2]])",
                          "rank 3: all_reduce(op=MAX, [float32[2]])"]),
    ("test_collective_mismatch", ["rank 0: all_reduce(op=SUM, [float32[2]])",
                                  "rank 1: broadcast(src=0, [float32[2]])"]),
])
def test_mismatch_lists_every_ranks_call(faults, test, lines):
    report = faults.report(test)
    assert "CollectiveMismatchError: collective mismatch: collective #1 on group" in report
    assert "the ranks' calls differ" in report
    for line in lines:
        assert line in report


def test_group_mismatch_is_a_deadlock_naming_both_groups(faults):
    report = faults.report("test_group_mismatch")
    assert "CollectiveDeadlockError: deadlock" in report
    assert re.search(r"rank 0: waiting in all_reduce\(op=SUM, \[float32\[1\]\]\) on group "
                     r"'\w+' \(ranks 0, 1\): rank 1 not there yet", report)
    assert re.search(r"rank 1: waiting in all_reduce\(op=SUM, \[float32\[1\]\]\) on group "
                     r"'\w+' \(ranks 1, 2\): rank 2 not there yet", report)
    assert "rank 3: finished its test (passed)" in report


def test_rank_that_never_calls_fails_at_once(faults):
    report = faults.report("test_rank_skips_collective")
    assert "deadlock" in report
    assert "rank 1: finished its test (passed)" in report
    assert "rank 1 not there yet" in report
    assert "(deadline" not in report


def test_send_send_deadlock(faults):
    report = faults.report("test_send_send_deadlock")
    assert "rank 0: waiting in send(to rank 1, tag=0, float32[1])" in report
    assert "rank 1: waiting in send(to rank 0, tag=0, float32[1])" in report
    assert "has not posted the matching recv" in report


def test_stuck_rank_fails_at_the_deadline_with_its_stack(faults):
    report = faults.report("test_stuck_rank")
    assert "(deadline 4 s)" in report
    assert "rank 1: did not finish before the deadline" in report
    assert "its stack at the deadline (its thread)" in report
    assert "time.sleep(0.02)" in report
    assert "DeadlineReached: rank 0: all_reduce(op=SUM, [float32[1]])" in report
    assert "did not complete before the test's deadline (4 s): rank 1 not there yet" in report


def test_skip_on_all_ranks_keeps_the_reason(faults):
    assert faults.verdict_line("test_skip_on_all").endswith(
        "skipped 'nothing to see on any rank'")


def test_skip_on_some_ranks_fails_and_says_who(faults):
    report = faults.report("test_skip_on_some")
    assert "ranks disagree: 2 of 4 ranks skipped while ranks 0, 2 ran the test" in report
    assert "rank 1 skipped: odd ranks skip" in report


def test_sys_exit_with_a_skip_code_skips(faults):
    assert faults.verdict_line("test_exit_with_skip_code").endswith(
        f"skipped '{needs_gpus(2)}'")


def test_sys_exit_nonzero_fails(faults):
    assert "rank 2: called sys.exit(3)" in faults.report("test_exit_nonzero")


def test_assert_on_rank_honours_msg(faults):
    assert "rank zero has its own opinion" in faults.report("test_assert_equal_on_rank_msg")
    report = faults.report("test_assert_not_equal_on_rank_msg")
    assert "ones should differ here" in report
    assert "1 of 4 ranks failed (rank 2)" in report


def test_collective_errors_reach_every_rank(faults):
    assert faults.verdict_line("test_errors_reach_every_rank").endswith("... ok")


def test_decorator_bare_and_with_arguments(faults):
    assert faults.verdict_line("test_bare").endswith("... ok")
    assert faults.verdict_line("test_world_size_2").endswith("... ok")
    report = faults.report("test_failure")
    assert "1 of 2 ranks failed (rank 1)" in report
    assert "only rank 0 is rank 0" in report


def test_decorator_timeout_is_honoured(faults):
    report = faults.report("test_timeout_honoured")
    assert "(deadline 2 s)" in report
    assert "rank 2: did not finish before the deadline" in report


@pytest.mark.skipif(torch.cuda.is_available(), reason=(
    "with a CUDA device, autograd's first backward starts a device thread, and torch "
    "refuses autograd in any process forked after it, threads or not"))
def test_a_threaded_test_leaves_fork_after_autograd_working():
    # On a CUDA build with no device, the backend's no-op CUDA guard reports a
    # device; autograd first run after it would refuse every later fork.
    run = run_python(["fork_after_threads.py"], timeout=120)
    assert "FORKED [1, 4]" in run.output, run.output


def test_disjoint_subgroups_with_one_name_keep_their_collectives_apart():
    # c10d names the groups [0, 1] and [2, 3] alike when each rank creates only
    # its own (the tag lookup pytorch's test_functional_api.py uses): their
    # all_reduces mixed ranks of both groups (3.0 where 5.0 was due). Not run
    # on upstream's harness: its threaded world puts all four ranks into one
    # two-rank store barrier there, which hangs now and then.
    run = run_python(["threaded_subgroups_by_tag.py", "-v"], timeout=120)
    for test in ("test_each_rank_creates_only_its_own_subgroup",
                 "test_the_same_tag_finds_the_same_group"):
        assert run.verdict_line(test).endswith(" ... ok"), run.output
    assert run.leftover_pids == [], run.output


def test_no_thread_outlives_100_tests():
    run = run_python(["threaded_many.py"], timeout=120)
    assert "COUNTS run=100 failures=10 errors=0" in run.output, run.output
    assert "ALIVE 0 []" in run.output, run.output


def test_missing_private_hook_skips_naming_it():
    run = run_python(["threaded_missing_hook.py", "-v"], timeout=60)
    assert run.returncode == 0, run.output
    expected = ("skipped 'the threaded backend needs private torch hooks that this torch "
                "lacks: torch._C._distributed_c10d._set_thread_isolation_mode'")
    assert run.verdict_line("test_anything").endswith(expected)
    assert run.verdict_line("test_decorated").endswith(expected)


# -- in-process checks of the upstream surface ---------------------------------

def test_upstream_surface():
    assert MultiThreadedTestCase.MAIN_THREAD_RANK == -1
    assert hasattr(MultiThreadedTestCase, "exception_queue")
    for name in ("_spawn_threads", "_run", "run_test_with_threaded_pg", "_join_threads",
                 "_check_return_codes", "perThreadSetUp", "perThreadTearDown",
                 "assertEqualOnRank", "assertNotEqualOnRank"):
        assert callable(getattr(MultiThreadedTestCase, name)), name


def test_check_return_codes_accepts_upstreams_call():
    def fn():
        pass

    # Upstream calls it with (failed_ranks, timeout, fn): no failures is a pass.
    MultiThreadedTestCase._check_return_codes([], 10, fn)
    try:
        raise ValueError("bad")
    except ValueError:
        import sys
        failure = (1, sys.exc_info())
    with pytest.raises(AssertionError, match="rank 1: raised an exception"):
        MultiThreadedTestCase._check_return_codes([failure], 10, fn)


def test_world_is_restored_after_a_threaded_world():
    before = dist.distributed_c10d._world
    with threaded_world(2, timeout=5):
        assert dist.distributed_c10d._world is not before
        assert active_session() is not None
    assert dist.distributed_c10d._world is before
    assert active_session() is None
    assert not dist.is_initialized()


def test_work_wait_with_its_own_timeout():
    errors = []
    with threaded_world(2, timeout=30):
        store = dist.HashStore()

        def rank_main(rank):
            dist.init_process_group("threaded", rank=rank, world_size=2, store=store)
            try:
                if rank == 0:
                    work = dist.all_reduce(torch.ones(1), async_op=True)
                    try:
                        work.wait(timeout=timedelta(seconds=0.2))
                    except CollectiveTimeoutError as exc:
                        errors.append(str(exc))
            except BaseException as exc:  # noqa: BLE001
                errors.append(type(exc).__name__)
            finally:
                dist.destroy_process_group()

        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert errors and "timed out after 0.2 s" in errors[0], errors


def test_each_rank_thread_has_its_own_generator():
    run = run_python(["threaded_rng.py", "-v"], timeout=120)
    assert run.returncode == 0, run.output
    for name in ("test_same_seed_same_numbers_on_every_rank",
                 "test_unseeded_stream_starts_like_a_rank_process",
                 "test_module_init_and_dropout_agree",
                 "test_rng_state_round_trip_is_per_thread",
                 "test_draws_match_a_rank_process_with_the_same_seed",
                 "test_ranks_draw_from_one_generator",  # per_thread_rng = False
                 "test_decorated_ranks_agree",
                 "test_compiled_random_ops_trace_and_eager_ones_stay_per_rank",
                 "test_eager_draws_stay_per_rank_while_another_rank_compiles",
                 "test_compile_still_knows_the_random_functions"):
        assert run.verdict_line(name).endswith("... ok"), name


def test_random_functions_handed_the_rank_generator_take_it_by_keyword_only():
    # A rank thread's CPU draws through these get generator=<its own>: were
    # the argument positional in some release, a caller's positional one
    # would collide with it.
    from distspawn.backends import thread_rng

    g = torch.Generator()
    t = torch.ones(4)
    p = torch.full((4,), 0.5)
    positional = {
        "rand": lambda: torch.rand(2, g), "randn": lambda: torch.randn(2, g),
        "randint": lambda: torch.randint(0, 3, (2,), g), "randperm": lambda: torch.randperm(3, g),
        "normal": lambda: torch.normal(p, p, g), "bernoulli": lambda: torch.bernoulli(p, g),
        "multinomial": lambda: torch.multinomial(p, 1, False, g),
        "uniform_": lambda: t.uniform_(0, 1, g), "normal_": lambda: t.normal_(0, 1, g),
        "random_": lambda: t.random_(0, 3, g), "bernoulli_": lambda: t.bernoulli_(0.5, g),
        "exponential_": lambda: t.exponential_(1, g), "geometric_": lambda: t.geometric_(0.5, g),
        "log_normal_": lambda: t.log_normal_(1, 2, g), "cauchy_": lambda: t.cauchy_(0, 1, g),
    }
    assert set(positional) == set(thread_rng._TAKES_GENERATOR)
    # the Tensor methods named like torch functions
    methods = [lambda: p.bernoulli(g), lambda: p.multinomial(1, False, g)]
    for call in [*positional.values(), *methods]:
        with pytest.raises(TypeError):
            call()


def test_seed_and_random_functions_are_restored_after_the_test():
    import torch.nn.functional as F
    import torch.random

    def current():
        return (torch.manual_seed, torch.get_rng_state, torch.random.set_rng_state,
                torch.randn, torch.Tensor.uniform_, F.dropout)

    originals = current()

    class Probe(MultiThreadedTestCase):
        @property
        def world_size(self):
            return 2

        def setUp(self):
            super().setUp()
            self._spawn_threads()

        def test_seed(self):
            torch.manual_seed(5)
            assert torch.randn is not originals[3]  # wrapped while the test runs
            torch.empty(2).uniform_()

    import unittest

    result = unittest.TestResult()
    Probe("test_seed").run(result)
    assert result.wasSuccessful(), result.failures + result.errors
    assert current() == originals
    assert "uniform_" not in vars(torch.Tensor)  # inherited again, as before


@pytest.mark.parametrize("change", ["field", "global"])
def test_state_torch_adds_to_world_is_per_rank_thread_without_a_list(change):
    run = run_python(["threaded_new_world_field.py", "-v"], env={"WORLD_CHANGE": change})
    assert run.verdict_line("test_each_rank_thread_has_its_own").endswith("ok"), run.output


def test_a_world_that_no_longer_builds_is_one_skip_naming_it():
    run = run_python(["threaded_new_world_field.py", "-v"], env={"WORLD_CHANGE": "broken"})
    line = run.verdict_line("test_each_rank_thread_has_its_own")
    assert "skipped" in line and "torch.distributed.distributed_c10d._World" in line, run.output
    assert "AttributeError" not in run.output


def test_a_session_ended_twice_waits_for_its_stuck_threads_once():
    # The join's finally ends the session, then the clean-up setUp added ends
    # it again: a thread stuck where no interrupt reaches (here a lock wait)
    # got the grace twice, so a hung test took 2 s more to fail.
    from distspawn.cases import threaded

    session = threaded._begin_session(1, 30.0)
    release = threading.Event()

    def stuck():
        try:
            release.wait()
        except BaseException:  # the interrupt lands once the wait returns
            pass

    thread = threading.Thread(target=stuck, daemon=True)
    thread.start()
    try:
        threaded._end_session(session, [thread])
        assert thread.is_alive()
        second_done = threading.Event()

        def end_again():
            threaded._end_session(session, [thread])
            second_done.set()

        ender = threading.Thread(target=end_again)
        ender.start()
        # The first took the whole grace; the second must not wait it again.
        assert second_done.wait(threaded.STOP_GRACE_S / 2)
    finally:
        release.set()
        thread.join()
    ender.join()
    assert active_session() is None
