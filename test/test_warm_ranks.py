"""Ranks start warm (dynamo and the test module preloaded) and still safely."""

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch

from harness import (
    MARKER_VAR,
    SCENARIOS,
    is_torch_cache,
    load_factor,
    processes_with_marker,
    run_python,
    run_python_on_upstream,
    short_temp_dir,
    upstream_module_imports,
)


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
    # warm_env_module.py reads, at import, a variable its class sets later.
    # The server that forks its ranks starts when its tests do (the first
    # server held warm_module alone), so it imports it with the variable set,
    # as each rank would: nothing to say.
    run = _pytest_run()
    assert run.returncode == 0 and "4 passed" in run.output, run.output
    assert "WarmImportWarning" not in run.output, run.output
    assert run.leftover_pids == [] and run.leftover_files == []


def test_a_module_that_read_a_variable_its_class_sets_later_is_imported_anew_with_it():
    # warm_env_module.py alone: the server imported it during collection,
    # before its class set the variable. It is imported anew with it, and its
    # ranks find it loaded (each test asserts so): nothing to say.
    run = run_python(["-m", "pytest", "-q", "-p", "no:cacheprovider", "warm_env_module.py"],
                     timeout=240)
    assert run.returncode == 0 and "2 passed" in run.output, run.output
    assert "WarmImportWarning" not in run.output, run.output
    assert run.leftover_pids == [] and run.leftover_files == []


def test_a_module_that_read_a_variable_each_test_sets_otherwise_is_left_to_the_ranks():
    # Imported anew for the first test's value, it is stale again for the
    # second: each rank imports it itself from then on, said once.
    run = run_python(["-m", "pytest", "-q", "-p", "no:cacheprovider", "warm_env_module.py"],
                     env={"WARM_MODE_PER_TEST": "1"}, timeout=240)
    assert run.returncode == 0 and "2 passed" in run.output, run.output
    assert run.output.count("WarmImportWarning") == 1, run.output
    assert ("test module warm_env_module (or a module it imports) read the environment at "
            "import, and ranks have it otherwise (WARM_MODE), again after it was imported "
            "anew; the rank server is restarted without it, and each rank imports it "
            "itself") in run.output, run.output
    assert run.leftover_pids == [] and run.leftover_files == []


@pytest.mark.parametrize("harness", ["distspawn", "stand-in", "upstream"])
def test_a_project_whose_import_registers_ops_runs_as_if_each_rank_imported_it(harness):
    # registering_project defines a torch.library op and a registry entry at
    # import (both outlive any re-import), and reads variables that its test
    # class sets later or that only the C-level environment has.
    if harness != "distspawn" and not upstream_module_imports(
            "torch.testing._internal.common_distributed"):
        pytest.skip("upstream's harness does not import here")
    options = ["--distspawn-stand-in"] if harness == "stand-in" else []
    env = {} if harness == "distspawn" else {"REGISTERING_IMPORTS": "upstream"}
    runner = run_python_on_upstream if harness == "upstream" else run_python
    run = runner(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-W",
                      "always::UserWarning", *options, "registering/test_registering.py"],
                     env=env)
    assert run.returncode == 0 and "2 passed" in run.output, run.output
    if harness != "upstream":
        # The project read REGISTERING_FLAVOUR before the second class set it:
        # the server imports it anew with it (its ranks check what it saw),
        # which needs no word.
        assert "WarmImportWarning" not in run.output, run.output
        # (upstream's harness leaves its store files behind)
        assert run.leftover_pids == [] and run.leftover_files == []


@pytest.mark.parametrize("harness", ["distspawn", "pytest", "stand-in", "upstream"])
def test_a_tmpdir_too_long_for_a_socket_runs_as_on_upstream(tmp_path, harness):
    # Upstream's harness spawns its ranks (no socket); the rank server's
    # socket goes to /tmp instead, as newer Pythons' multiprocessing does.
    if harness in ("stand-in", "upstream") and not upstream_module_imports(
            "torch.testing._internal.common_distributed"):
        pytest.skip("upstream's harness does not import here")
    long_tmpdir = tmp_path / ("a-directory-name-long-enough-" * 3)
    env = {"LONG_TMPDIR_UNDER": str(tmp_path)}
    if harness in ("stand-in", "upstream"):
        env["UPSTREAM_HARNESS"] = "1"
    if harness == "pytest":  # the whole run under it, the plugin's early server too
        long_tmpdir.mkdir()
        env["TMPDIR"] = str(long_tmpdir)
    runner = run_python_on_upstream if harness == "upstream" else run_python
    args = {"distspawn": ["long_tmpdir.py", "-v"], "upstream": ["long_tmpdir.py", "-v"],
            "stand-in": ["-m", "distspawn.stand_in", "long_tmpdir.py", "-v"],
            "pytest": ["-m", "pytest", "-v", "-p", "no:cacheprovider", "long_tmpdir.py"]}
    run = runner(args[harness], env=env)
    assert run.returncode == 0, run.output
    if harness == "pytest":
        assert "long_tmpdir.py::LongTmpdir::test_x PASSED" in run.output, run.output
    else:
        assert run.verdict_line("test_x") == "test_x (__main__.LongTmpdir.test_x) ... ok"
    assert "AF_UNIX path too long" not in run.output and "TMPDIR=" not in run.output
    if harness == "upstream":
        return  # (which leaves its store files behind)
    assert run.leftover_pids == []
    assert [p for p in long_tmpdir.iterdir()
            if not is_torch_cache(p.relative_to(long_tmpdir))] == []
    if harness != "pytest":  # (whose output hides the exit line)
        folder = next(line.split(" ", 2)[2] for line in run.output.splitlines()
                      if line.startswith("MULTIPROCESSING FOLDER "))
        assert folder.startswith("/tmp/pymp-") and not os.path.exists(folder), folder


def _left_to_the_ranks(env, why):
    # warm_module's ranks import it themselves, and the run says why once.
    run = _pytest_run(env)
    assert run.returncode == 0 and "4 passed" in run.output, run.output
    assert run.output.count("WarmImportWarning: distspawn: test module warm_module is not "
                            f"preloaded into the rank server: {why}; each rank imports it "
                            "itself") == 1, run.output
    assert run.leftover_pids == [] and run.leftover_files == []


def test_a_module_whose_import_starts_a_thread_is_not_preloaded_and_says_so_once():
    _left_to_the_ranks({"WARM_START_THREAD": "1"}, "importing it started thread(s) poller")


def test_the_server_imports_a_test_module_once(tmp_path):
    # In a child of the server that checks it and then serves in its place:
    # not once to check it and again to keep it.
    log = tmp_path / "imports.log"
    run = run_python(["-m", "pytest", "-q", "-p", "no:cacheprovider", "warm_module.py"],
                     env={"WARM_IMPORT_LOG": str(log)}, timeout=240)
    assert run.returncode == 0 and "2 passed" in run.output, run.output
    imports = log.read_text().splitlines()
    assert len(imports) == 2, imports  # the test process's and the server's
    assert sorted(line.split(" ", 1)[1] for line in imports) == [
        "MainProcess", "distspawn rank server"], imports
    assert run.leftover_pids == [] and run.leftover_files == []


def test_an_import_that_ends_the_server_is_left_to_the_ranks():
    _left_to_the_ranks({"WARM_EXIT_IN_SERVER": "1"},
                       "importing it ended the process (exit status 3)")


def _usable_cpus():
    return len(os.sched_getaffinity(0))


@pytest.mark.parametrize("setting, expected", [
    ({}, lambda cpus: max(1, cpus // 4)),
    ({"DISTSPAWN_RANK_THREADS": "3"}, lambda cpus: 3),
    ({"OMP_NUM_THREADS": "2"}, lambda cpus: 2),
    ({"DISTSPAWN_RANK_THREADS": "torch"}, lambda cpus: torch.get_num_threads()),
], ids=["shared-out", "explicit", "users-omp", "torch-default"])
def test_ranks_share_the_cpus_out_unless_told_otherwise(setting, expected):
    env = {**setting, "EXPECT_THREADS": str(expected(_usable_cpus()))}
    if "OMP_NUM_THREADS" not in setting:
        env["OMP_NUM_THREADS"] = ""  # as if unset (harness.run_python keeps the rest)
    run = run_python(["rank_threads.py", "-v"], env=env, timeout=120)
    assert run.returncode == 0, run.output


def test_a_bad_thread_setting_is_one_clear_error_before_any_rank_starts():
    run = run_python(["rank_threads.py", "-v", "FreshRanks"],
                     env={"DISTSPAWN_RANK_THREADS": "many", "EXPECT_THREADS": "1"})
    assert run.returncode == 1
    assert ("DISTSPAWN_RANK_THREADS='many' is not accepted; use 'auto' (the default: the "
            "usable CPUs shared out among the ranks, unless OMP_NUM_THREADS is set), 'torch' "
            "(torch's own default in every rank) or a thread count >= 1") in run.output
    assert run.leftover_pids == [] and run.leftover_files == []


@pytest.mark.parametrize("selection", [["--collect-only"], ["-k", "no_such_test"]])
def test_a_run_that_starts_no_rank_leaves_no_server_behind(selection):
    # The server starts when pytest collects the first multi-process class and
    # waits for the module list; a run that never starts a rank must still end
    # at once and take the server with it.
    run = run_python(["-m", "pytest", "-q", "-p", "no:cacheprovider", *selection,
                      "warm_module.py"], timeout=60)
    assert run.returncode in (0, 5), run.output
    assert run.leftover_pids == [] and run.leftover_files == []


def test_each_test_runs_on_processes_that_ran_no_other_test(tmp_path):
    run = run_python(["fresh_ranks.py"], env={"FRESH_DIR": str(tmp_path)}, timeout=120)
    assert run.returncode == 0 and "Ran 8 tests" in run.output, run.output
    assert len(list(tmp_path.iterdir())) == 8 * 3
    assert run.leftover_pids == [] and run.leftover_files == []


def test_a_server_still_importing_when_the_test_process_exits_ends_with_it():
    # Ranks wait for the server's report, so one that has not reported has
    # forked none: at exit it is ended, not left importing torch for seconds.
    # The check is registered before distspawn's own, so it runs after it.
    script = ("import atexit, os\n"
              "from child_processes import forkservers_of\n"
              "atexit.register(lambda: print('servers at exit:',\n"
              "                              len(forkservers_of(os.getpid()))))\n"
              "from distspawn.engine import rank_server\n"
              "rank_server.start_rank_server([])\n"
              "print('servers started:', len(forkservers_of(os.getpid())))\n")
    run = run_python(["-c", script], timeout=120)
    assert run.returncode == 0, run.output
    assert "servers started: 1" in run.output and "servers at exit: 0" in run.output, run.output
    assert run.leftover_pids == [] and run.leftover_files == []


def test_the_rank_server_ends_with_the_test_process():
    # A normal exit would then tear down torch, dynamo and the test modules in
    # the server: about 0.8 s of CPU after the test process has gone, which
    # whatever reads the test process's output waits for too. The output goes
    # to a file here, so that the test process's own end can be timed.
    marker = uuid.uuid4().hex
    with short_temp_dir() as tmp:  # not tmp_path: see short_temp_dir
        env = {**os.environ, "TMPDIR": tmp, MARKER_VAR: marker, "FRESH_DIR": tmp}
        with open(Path(tmp) / "output", "w+") as output:
            done = subprocess.run([sys.executable, "fresh_ranks.py", "FreshRanks.test_0"],
                                  cwd=SCENARIOS, env=env, stdout=output, stderr=subprocess.STDOUT)
            ended = time.monotonic()
            left = processes_with_marker(marker, settle_s=10.0)
            outlived = time.monotonic() - ended
            output.seek(0)
            text = output.read()
    assert done.returncode == 0 and "Ran 1 test" in text, text
    assert left == []
    assert outlived < 0.3 * load_factor(), f"the server outlived the test by {outlived:.2f} s"


def _guessed_run(tmp_path, files, *options, **env):
    # guessed_imports/: a package, so pytest imports ranks_a.py as
    # guessed_imports.ranks_a; the server is sent that guess while pytest
    # collects. Returns the run and each import: (module, process, event).
    log = tmp_path / "imports.log"
    log.touch()
    # In file order: what the server imports, and when, follows it (pytest-randomly,
    # where installed, would shuffle it).
    # A fresh interpreter: the server's guess races the test process's own
    # import of torch, which a warm_python run has made already.
    run = run_python(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                      *options,
                      *(f"guessed_imports/{name}.py" for name in files)],
                     env={"GUESS_IMPORT_LOG": str(log), **env}, timeout=240, warm=False)
    imports = [tuple(line.split()[:3]) for line in log.read_text().splitlines()]
    return run, imports


def test_the_server_imports_test_modules_while_pytest_collects_them(tmp_path):
    # ranks_a's import in the test process waits until the server's has
    # begun: it begins on the guess, before collection is over, not after.
    run, imports = _guessed_run(tmp_path, ["ranks_a"], GUESS_WAIT_FOR_SERVER="1")
    assert run.returncode == 0 and "1 passed" in run.output, run.output
    server, test_process = "'distspawn", "'MainProcess'"
    assert imports.index(("guessed_imports.ranks_a", "began", server)) \
        < imports.index(("guessed_imports.ranks_a", "ended", test_process)), imports
    # Once in each process: the guess was right, and kept.
    assert [i[1:] for i in imports if i[1] == "began"] == [("began", test_process),
                                                          ("began", server)], imports
    assert "WarmImportWarning" not in run.output, run.output
    assert run.leftover_pids == [] and run.leftover_files == []


@pytest.mark.parametrize("folder", ["empty", "shadowing"])
def test_a_folder_put_in_sys_path_after_the_guess(tmp_path, folder):
    # As pytest does for each test folder outside a package that it imports
    # after the guess. An empty folder changes no import the guess made: it
    # stands. shadowing/ holds a module of a name ranks_a imported
    # (guess_shadowed, from guess_lib/): a rank importing ranks_a itself would
    # now find that one (ranks_a asserts it in the ranks), so the server
    # imports ranks_a afresh.
    path = tmp_path / "empty" if folder == "empty" else SCENARIOS / "shadowing"
    path.mkdir(exist_ok=True)
    run, imports = _guessed_run(tmp_path, ["ranks_a"], GUESS_INSERT_AFTER_COLLECTION=str(path))
    assert run.returncode == 0 and "1 passed" in run.output, run.output
    in_server = [i[0] for i in imports if i[1:] == ("began", "'distspawn")]
    assert in_server.count("guessed_imports.ranks_a") == (1 if folder == "empty" else 2), imports
    assert run.leftover_pids == [] and run.leftover_files == []


@pytest.mark.parametrize("case", ["a class from another module", "the environment changed"])
def test_a_wrong_guess_leaves_nothing_in_the_ranks(tmp_path, case):
    # The guess named ranks_c, whose one rank class is ranks_b's (ranks need
    # ranks_b alone); or the environment changed after the guess in a
    # variable ranks_a read at import. The ranks see what their own imports
    # would (the tests assert it in them): the server dropped all it imported
    # on the guess and imported the list's modules afresh. It says nothing:
    # they are still preloaded.
    if case == "a class from another module":
        run, imports = _guessed_run(tmp_path, ["ranks_c"])
        # ranks_c imports ranks_b: on the guess, then again without ranks_c.
        expected = {"guessed_imports.ranks_b": 2, "guessed_imports.ranks_c": 1}
    else:
        run, imports = _guessed_run(tmp_path, ["ranks_a"], GUESS_SET_AFTER_COLLECTION="1")
        expected = {"guessed_imports.ranks_a": 2}
    assert run.returncode == 0 and "1 passed" in run.output, run.output
    in_server = [i[0] for i in imports if i[1:] == ("began", "'distspawn")]
    assert {name: in_server.count(name) for name in expected} == expected, imports
    assert "WarmImportWarning" not in run.output, run.output
    assert run.leftover_pids == [] and run.leftover_files == []


def test_a_module_whose_tests_were_deselected_is_not_in_the_ranks(tmp_path):
    # ranks_a and ranks_b are collected, and the server guesses ranks_a (the
    # first); -k keeps ranks_b's test only. Its ranks must not find ranks_a
    # loaded (ranks_b asserts it in them): the list names ranks_b, so the
    # guess is dropped and ranks_b is imported in its place.
    run, imports = _guessed_run(tmp_path, ["ranks_a", "ranks_b"], "-k", "GuessedB")
    assert run.returncode == 0 and "1 passed, 1 deselected" in run.output, run.output
    in_server = [i[0] for i in imports if i[1:] == ("began", "'distspawn")]
    assert in_server == ["guessed_imports.ranks_a", "guessed_imports.ranks_b"], imports
    assert run.leftover_pids == [] and run.leftover_files == []


def _pair_on_one_server(tmp_path, server_imports_of_b, **env):
    # ranks_a's test, then ranks_b's, on one server start (a switch imports
    # no torch again), with nothing to warn of; the test modules the server
    # imported, in order: ranks_a's, then ranks_b's as many times as given.
    run, imports = _guessed_run(tmp_path, ["ranks_a", "ranks_b"], "-p", "count_server_starts",
                                **env)
    assert run.returncode == 0 and "2 passed" in run.output, run.output
    in_server = [i[0] for i in imports if i[1:] == ("began", "'distspawn")]
    assert in_server == ["guessed_imports.ranks_a"] + \
        ["guessed_imports.ranks_b"] * server_imports_of_b, imports
    assert "rank server starts: 1," in run.output, run.output
    assert "WarmImportWarning" not in run.output, run.output
    assert run.leftover_pids == [] and run.leftover_files == []


def test_ranks_of_one_test_module_never_see_another_kept_in_the_run(tmp_path):
    # Both modules' tests run. A rank started afresh imports its own test
    # module alone, and one module's imports can change what another's see
    # (pytorch's RPC faulty-agent fixture rebinds the RPC registry's
    # BackendType at import). ranks_b asserts in its ranks that ranks_a is
    # not loaded: the server held ranks_a for ranks_a's test, then was
    # switched to ranks_b alone: the server's process that holds torch and
    # distspawn, and no test module, forked one that imported ranks_b.
    _pair_on_one_server(tmp_path, 1)


def test_the_server_imports_the_next_test_module_while_the_last_ones_tests_run(tmp_path):
    # Told ranks_b's tests come next, the server imports it while ranks_a's
    # test runs: its ranks wait for that import to begin (and fail if it
    # never does). That import is the one ranks_b's ranks are forked from.
    _pair_on_one_server(tmp_path, 1, GUESS_WAIT_FOR_NEXT="1")


def test_a_next_module_imported_before_the_environment_changed_is_imported_again(tmp_path):
    # ranks_b reads GUESS_LATE_VAR at import, and the test process sets it as
    # ranks_b's tests begin, after the server imported ranks_b ahead of them:
    # that import is dropped, and ranks_b imported afresh, as each of its
    # ranks would (its ranks assert it), with nothing to warn of.
    _pair_on_one_server(tmp_path, 2, GUESS_SET_FOR_RANKS_B="1")


def test_what_the_server_made_itself_outlives_each_module_it_served(tmp_path):
    # The server makes a temporary folder as it starts (as torch 2.8 does,
    # to write generated code into later). The process that served
    # ranks_a's ranks ends at the switch to ranks_b: it leaves the folder,
    # which ranks_b's ranks find (they assert it); the server removes it as
    # the run ends (the run's temp folder is checked for leftovers).
    folder = SCENARIOS / "made_at_start"
    _pair_on_one_server(tmp_path, 1, GUESS_FOLDER_MADE_AT_START="1", PYTHONPATH=str(folder))


def test_a_module_the_server_refused_is_not_tried_again_when_its_tests_come_back(tmp_path):
    # warm_module's import starts a thread: refused, said once, and its ranks
    # import it themselves. Its tests run before and after another module's
    # (the server switched to that one in between): the server does not
    # import it again for the second, as it does not in a run of it alone.
    def server_imports(*node_ids):
        log = tmp_path / f"imports-{len(node_ids)}.log"
        run = run_python(["-m", "pytest", "-q", "-p", "no:cacheprovider", *node_ids],
                         env={"WARM_START_THREAD": "1", "WARM_IMPORT_LOG": str(log),
                              "GUESS_IMPORT_LOG": str(tmp_path / "guess.log")}, timeout=240)
        assert run.returncode == 0 and f"{len(node_ids)} passed" in run.output, run.output
        assert run.output.count("WarmImportWarning") == 1, run.output
        assert run.leftover_pids == [] and run.leftover_files == []
        return log.read_text().count("distspawn rank server")

    test_a = "warm_module.py::WarmModule::test_a_ranks_find_the_module_loaded_unless_unsafe"
    test_b = "warm_module.py::WarmModule::test_b_ranks_see_no_state_from_an_earlier_test"
    alone = server_imports(test_a)
    assert alone >= 1
    assert server_imports(test_a, "guessed_imports/ranks_b.py", test_b) == alone


@pytest.mark.parametrize("command", [["-m", "pytest", "-q", "-p", "no:cacheprovider",
                                      "-p", "no:randomly", "-s", "forked_test_process.py"],
                                     ["-m", "unittest", "-v", "forked_test_process"]],
                         ids=["pytest", "unittest"])
def test_a_test_process_forked_from_the_one_with_the_server_starts_its_own_ranks(command):
    # pytest-forked forks the test process for each test. Before, the child
    # used the parent's server: under pytest it waited for the server's report
    # on a thread the fork did not copy (a run with --forked hung), and
    # otherwise multiprocessing raised ChildProcessError asking after a
    # process that is not the child's.
    run = run_python(command, timeout=240)
    assert run.returncode == 0, run.output
    assert run.output.count("child: test_all_reduce (forked_test_process.SumOnTwoRanks"
                            ".test_all_reduce) ... ok") == 2, run.output
    assert "ResourceWarning" not in run.output, run.output
    assert run.leftover_pids == [] and run.leftover_files == []
