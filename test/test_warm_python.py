"""The suite's warm interpreter (warm_python): a run forked from it is one a
fresh interpreter would have given, and what could differ starts afresh."""

import json
import pytest

import harness
import warm_python

# What differs between any two runs, fresh or warm: the run's temp folder,
# and what is drawn at random.
DIFFERS_EVERY_RUN = {"tmp", "random", "authkey"}


def probe(warm: bool, *args: str) -> tuple[int, dict, str]:
    run = harness.run_python(["process_probe.py", *args], env={"PROBE_VAR": "set"},
                             warm=warm)
    first, rest = run.output.split("\n", 1)
    return run.returncode, json.loads(first), rest


def test_a_warm_run_sees_what_a_fresh_interpreter_sees():
    code, warm, warm_rest = probe(True, "7")
    fresh_code, fresh, fresh_rest = probe(False, "7")
    assert (code, warm_rest) == (fresh_code, fresh_rest) == (7, "to stderr\n")
    same = {key for key in fresh if key not in DIFFERS_EVERY_RUN}
    assert {key: warm[key] for key in same} == {key: fresh[key] for key in same}
    assert warm["probe_var"] == warm["c_level_var"] == "set"
    _, again, _ = probe(True, "7")
    for key in DIFFERS_EVERY_RUN:  # not the zygote's, nor the last run's
        assert len({warm[key], again[key], fresh[key]}) == 3, key


@pytest.mark.parametrize("code", [
    "raise ValueError('shown')",
    "import sys; sys.exit('a message')",
    "import atexit; atexit.register(print, 'atexit ran'); raise KeyboardInterrupt",
    "import os, signal, threading; signal.pthread_kill(threading.get_ident(), signal.SIGSEGV)",
    "import threading; threading.Timer(0.2, print, ['a thread outlived the main one']).start()",
], ids=["exception", "exit-message", "interrupt", "segfault", "thread"])
def test_a_warm_run_ends_as_a_fresh_one_does(code):
    warm = harness.run_python(["-c", code], warm=True)
    fresh = harness.run_python(["-c", code], warm=False)
    assert (warm.returncode, warm.output) == (fresh.returncode, fresh.output)
    assert "warm_python" not in warm.output  # the zygote's frames are not shown


def test_a_warm_run_is_a_fork_of_the_zygote():
    # Else the tests above would compare two fresh runs.
    run = harness.run_python(["-c", "import sys; print('torch' in sys.modules)"], warm=True)
    assert run.output == "True\n"


def test_what_a_warm_run_leaves_running_is_found_without_the_marker():
    # A process forked, not started, shows the zygote's environment in /proc:
    # the run's session finds it.
    code = ("import os, time\n"
            "if os.fork() == 0:\n"
            "    os.closerange(0, 3)\n"
            "    time.sleep(60)\n"
            "    os._exit(0)\n")
    run = harness.run_python(["-c", code], warm=True)
    try:
        assert len(run.leftover_pids) == 1
    finally:
        for pid in run.leftover_pids:
            harness.os.kill(pid, 9)


def test_a_warm_run_past_its_timeout_is_interrupted_and_shows_where_it_waited():
    # A run inherits SIGINT ignored where its ancestors ignore it (a CI script
    # started in the background), as a fresh interpreter does: the Ctrl-C is
    # then lost and the run is killed, as harness.run_python says.
    ignored = harness.run_python(
        ["-c", "import signal; print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)"])
    shown = r"waiting\n$" if ignored.output == "True\n" else \
        r"waiting\n(.|\n)*line 3(.|\n)*KeyboardInterrupt"
    # Long enough to reach the sleep on a loaded machine: the Ctrl-C lands there.
    code = "import time\nprint('waiting', flush=True)\ntime.sleep(120)"
    with pytest.raises(harness.RanPastTimeout, match=shown):
        harness.run_python(["-c", code], timeout=15, warm=True)


@pytest.mark.parametrize("args, env, why", [
    (["-X", "dev", "x.py"], {}, "the interpreter option ['-X']"),
    (["-m"], {}, "an option without its argument"),
    (["x.py"], {"TORCH_LOGS": "+dynamo"}, "the environment differs in TORCH_LOGS, read at start"),
    (["x.py"], {"PYTHONPATH": "/elsewhere"}, "differs in PYTHONPATH"),
    (["-m", "pytest"], {"DISTSPAWN_STAND_IN": "1", "TMPDIR": "/t"}, None),
])
def test_what_could_differ_in_a_warm_run_starts_afresh(args, env, why):
    found = warm_python.why_cold(args, {**env}, {})
    assert (found is None) if why is None else (why in found)


def test_a_variable_the_preload_read_makes_a_run_start_afresh():
    # Noted as the installed release's torch, numpy and pytest import; torch
    # reads some of its own through os.environ on every release in the window.
    harness.run_python(["-c", "pass"])  # the zygote is running
    read = warm_python.ZYGOTE.read
    assert any(key.startswith("TORCH") for key in read), sorted(read)
    outside_prefixes = sorted(key for key in read if not key.startswith(warm_python.READ_AT_START))
    assert warm_python.why_cold(["x.py"], {"SOME_OTHER": "1"}, {}, read) is None
    for key in (outside_prefixes or sorted(read))[:3]:
        assert key in warm_python.why_cold(["x.py"], {key: "changed"}, {}, read)
