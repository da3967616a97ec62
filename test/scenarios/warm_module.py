"""Run under pytest: this module is preloaded into the rank server, unless its
import starts a thread (WARM_START_THREAD=1) or ends the server
(WARM_EXIT_IN_SERVER=1), when ranks import it themselves."""

import multiprocessing
import os
import threading

from distspawn import MultiProcessTestCase

IMPORTED_IN = os.getpid()
if os.environ.get("WARM_IMPORT_LOG"):  # one line per import, naming the process
    with open(os.environ["WARM_IMPORT_LOG"], "a") as log:
        log.write(f"{IMPORTED_IN} {multiprocessing.current_process().name}\n")
# An import that ends the process it runs in, in the rank server alone.
if (os.environ.get("WARM_EXIT_IN_SERVER") == "1"
        and multiprocessing.current_process().name == "distspawn rank server"):
    os._exit(3)
# The rank server sets it for itself alone (its imports must not make torch
# refuse CUDA in the ranks it forks): read here, it restarts nothing.
NVML_VAR = "PYTORCH_NVML_BASED_CUDA_CHECK"
NVML_CHECK_AT_IMPORT = os.environ.get(NVML_VAR)
SEEN_BY_THIS_PROCESS = []
STARTS_THREAD = os.environ.get("WARM_START_THREAD") == "1"
if STARTS_THREAD:
    threading.Thread(target=threading.Event().wait, name="poller", daemon=True).start()


class WarmModule(MultiProcessTestCase):
    world_size = 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_a_ranks_find_the_module_loaded_unless_unsafe(self):
        imported_by_the_rank = IMPORTED_IN == os.getpid()
        unsafe = STARTS_THREAD or os.environ.get("WARM_EXIT_IN_SERVER") == "1"
        assert imported_by_the_rank == unsafe, (IMPORTED_IN, os.getpid())
        user_value = os.environ.get(NVML_VAR)  # a rank has the test process's environment
        expected = user_value if imported_by_the_rank else (user_value or "1")
        assert NVML_CHECK_AT_IMPORT == expected, (NVML_CHECK_AT_IMPORT, user_value)
        SEEN_BY_THIS_PROCESS.append(self.rank)

    def test_b_ranks_see_no_state_from_an_earlier_test(self):
        assert SEEN_BY_THIS_PROCESS == []
        assert threading.active_count() == 1 + STARTS_THREAD + 1  # main, poller, listener
