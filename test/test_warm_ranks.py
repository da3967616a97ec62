"""Ranks start warm (dynamo and the test module preloaded) and still safely."""

from harness import run_python


def test_ddp_tests_that_destroy_their_group_first_never_hang():
    # 24 tests x 4 ranks; before engine.group_keeper about one in ten hung here.
    run = run_python(["ddp_teardown.py"], env={"DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": "60"}, timeout=240)
    assert run.returncode == 0, run.output
    assert "Ran 24 tests" in run.output and "OK" in run.output.splitlines()[-1], run.output
    assert run.leftover_pids == [] and run.leftover_files == []


def _pytest_run(env=None):
    return run_python(["-m", "pytest", "-q", "-p", "no:cacheprovider", "warm_module.py",
                       "warm_env_module.py"], env=env, timeout=240)


def test_test_modules_are_preloaded_and_each_test_gets_fresh_ranks():
    # warm_module.py asserts in its ranks that they found it loaded (imported
    # in another process: the server) and saw nothing an earlier test left.
    run = _pytest_run()
    assert run.returncode == 0 and "3 passed" in run.output, run.output
    assert "WarmImportWarning" not in run.output, run.output
    assert run.leftover_pids == [] and run.leftover_files == []


def test_a_module_whose_import_starts_a_thread_is_not_preloaded_and_says_so_once():
    run = _pytest_run({"WARM_START_THREAD": "1"})
    assert run.returncode == 0 and "3 passed" in run.output, run.output
    assert run.output.count("WarmImportWarning: distspawn: test module warm_module is not "
                            "preloaded into the rank server: importing it started thread(s) "
                            "poller; each rank imports it itself") == 1, run.output
    assert run.leftover_pids == [] and run.leftover_files == []
