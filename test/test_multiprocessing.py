"""Sharing tensors between processes: our port of upstream's test_multiprocessing.py
CPU tests, on distspawn's TestCase and distspawn.sharing's helpers. CUDA tests
are gated on CUDA (and CUDA IPC) being there."""

import sys
import unittest
from unittest import mock

import torch
import torch.multiprocessing as mp
import torch.utils.hooks
from torch.nn import Parameter

from distspawn import IS_MACOS, NO_MULTIPROCESSING_SPAWN, TestCase, run_tests
from distspawn import sharing
from distspawn.sharing import HAS_SHM_FILES, fs_sharing, leak_checker

TEST_REPEATS = 30
WAIT_S = 30  # generous: a child that has not answered by then is stuck
TEST_CUDA_IPC = (torch.cuda.is_available() and sys.platform not in ("darwin", "win32")
                 and torch.version.hip is None)
NEEDS_CUDA_IPC = unittest.skipIf(not TEST_CUDA_IPC, "CUDA IPC not available")
NEEDS_SPAWN = unittest.skipIf(NO_MULTIPROCESSING_SPAWN, "needs the spawn start method")
NO_FD_STRATEGY = unittest.skipIf(sys.platform == "darwin",
                                 "the file_descriptor strategy does not exist on macOS")


# -- what the children run (module level: spawn children import them) --------------------

def fill_what_arrives(queue, done):
    tensors = queue.get()
    tensors[0][:] = 4  # also changes tensors[1], a view of the same storage
    done.set()


def fill_and_add_one(tensor):
    tensor.fill_(4)
    return tensor.add(1)


def send_ones_twice(queue, release, device, dtype):
    tensor = torch.ones(5, 5, device=device, dtype=dtype)
    queue.put(tensor)
    queue.put(tensor)
    release.wait()


def add_three(tensor):
    tensor.add_(3)


def report_requires_grad(queue, ready):
    tensor = queue.get()
    ready.set()
    queue.put(tensor.requires_grad)


def check_shared_autograd_state(queue, ready, parent_changed, device, is_parameter):
    tensor = queue.get()
    ready.set()
    parent_changed.wait()
    expected = torch.arange(1.0, 26, device=device).view(5, 5)
    expected[0, 0] = 1000
    ok = tensor.data.equal(expected)  # the parent's change is visible here
    tensor.data[:] = torch.ones(5, 5, device=device)  # ... and ours there
    ok &= tensor.grad is None  # gradients and hooks do not travel
    ok &= not tensor._backward_hooks
    ok &= type(tensor) is (Parameter if is_parameter else torch.Tensor)
    tensor._grad = torch.ones(5, 5, device=device)  # must not reach the parent
    queue.put(ok)


def receive_parameter(queue, answers):
    # Unpickling the parameter is the test. It comes through a queue, not as a
    # Process argument: an argument stays referenced in the child until it
    # exits without running destructors, so a CUDA one would never hand back
    # its IPC reference, and the parent's ref-counter file in /dev/shm would
    # outlive the test (and fail the next leak check in this process).
    param = queue.get()
    answers.put((type(param).__name__, param.dtype, param.requires_grad))
    del param


def backward_once(scale=1):
    torch.rand(3).requires_grad_(True).mean().backward()
    return scale ** 2


class AddThree(mp.Process):
    def __init__(self, tensor):
        super().__init__(daemon=True)
        self.tensor = tensor

    def run(self):
        add_three(self.tensor)


class TestMultiprocessing(TestCase):
    def tearDown(self):
        if torch.cuda.is_available():
            torch.cuda.ipc_collect()
        super().tearDown()

    def _join(self, process):
        process.join(WAIT_S)
        self.assertFalse(process.is_alive(), f"{process.name} still running after {WAIT_S}s")

    # -- sharing through queues and pools ------------------------------------------------

    def _test_sharing(self, ctx=mp, device="cpu", dtype=torch.float, repeat=1):
        def child_writes_into_parent_tensors():
            base = torch.zeros(5, 5).to(device, dtype)
            queue, done = ctx.Queue(), ctx.Event()
            tensors = [base, base[:, 1]]
            queue.put(tensors)
            child = ctx.Process(target=fill_what_arrives, args=(queue, done), daemon=True)
            child.start()
            checker.check_pid(child.pid)
            self.assertTrue(done.wait(WAIT_S), "the child never filled the tensors")
            self.assertTrue(tensors[0].eq(4).all())
            self.assertTrue(tensors[1].eq(4).all())
            self._join(child)

        def parent_receives_one_storage_twice():
            queue, release = ctx.Queue(), ctx.Event()
            child = ctx.Process(target=send_ones_twice, args=(queue, release, device, dtype),
                                daemon=True)
            child.start()
            checker.check_pid(child.pid)
            first, second = queue.get(timeout=WAIT_S), queue.get(timeout=WAIT_S)
            self.assertTrue(first.eq(1).all())
            self.assertEqual(type(first.untyped_storage()), type(second.untyped_storage()))
            self.assertEqual(first.untyped_storage().data_ptr(),
                             second.untyped_storage().data_ptr())
            del first, second
            release.set()
            self._join(child)

        with leak_checker(self) as checker:
            for _ in range(repeat):
                child_writes_into_parent_tensors()
                parent_receives_one_storage_twice()

    def _test_preserve_sharing(self, ctx=mp, repeat=1):
        def views_stay_views():
            base = torch.randn(5, 5)
            data = [base.untyped_storage(), base, base[2], base[:, 1]]
            queue = ctx.Queue()
            queue.put(data)
            received = queue.get(timeout=WAIT_S)
            self.assertEqual(received[1:], data[1:], atol=0, rtol=0)
            self.assertEqual(received[0].data_ptr(), data[0].data_ptr())
            for tensor in received[1:]:
                self.assertEqual(tensor.untyped_storage().data_ptr(), data[0].data_ptr())

        with leak_checker(self):
            for _ in range(repeat):
                views_stay_views()

    def _test_pool(self, ctx=mp, repeat=1):
        def pool_fills_shared_buffers():
            pool = ctx.Pool(2)
            for worker in pool._pool:
                checker.check_pid(worker.pid)
            buffers = [torch.zeros(2, 2) for _ in range(4)]
            results = pool.map(fill_and_add_one, buffers, 1)
            self.assertEqual(len(results), len(buffers))
            for result in results:
                self.assertEqual(result, torch.full((2, 2), 5.0), atol=0, rtol=0)
            for buffer in buffers:  # the workers filled the parent's own memory
                self.assertEqual(buffer, torch.full((2, 2), 4.0), atol=0, rtol=0)
            pool.close()
            pool.join()

        with leak_checker(self) as checker:
            for _ in range(repeat):
                pool_fills_shared_buffers()

    @NO_FD_STRATEGY
    def test_fd_sharing(self):
        self._test_sharing(repeat=TEST_REPEATS)

    @NO_FD_STRATEGY
    def test_fd_preserve_sharing(self):
        self._test_preserve_sharing(repeat=TEST_REPEATS)

    @NO_FD_STRATEGY
    def test_fd_pool(self):
        self._test_pool(repeat=TEST_REPEATS)

    def test_fs_sharing(self):
        with fs_sharing():
            self._test_sharing(repeat=1 if IS_MACOS else TEST_REPEATS)

    def test_fs_preserve_sharing(self):
        with fs_sharing():
            self._test_preserve_sharing(repeat=TEST_REPEATS)

    def test_fs_pool(self):
        with fs_sharing():
            self._test_pool(repeat=TEST_REPEATS)

    @unittest.skipIf(not HAS_SHM_FILES, "no /dev/shm to look for shared-memory files in")
    def test_fs(self):
        def a_queued_storage_has_a_file():
            storage = torch.empty(4, dtype=torch.float64).untyped_storage()
            queue = mp.Queue()
            self.assertFalse(checker.has_shm_files())
            queue.put(storage)
            queue.get(timeout=WAIT_S)  # once it went through the queue, its file exists
            self.assertTrue(checker.has_shm_files(wait=False))

        with fs_sharing(), leak_checker(self) as checker:
            for _ in range(TEST_REPEATS):
                a_queued_storage_has_a_file()

    def test_leak_checker_names_the_files_left_behind(self):
        with fs_sharing(), mock.patch.object(sharing, "MAX_WAITING_TIME_IN_SECONDS", 0.2):
            kept = torch.zeros(4).share_memory_()
            checker = leak_checker(self)
            self.assertTrue(checker.shm_files(), "file_system sharing made no /dev/shm file")
            with self.assertRaisesRegex(AssertionError, r"left behind in /dev/shm: \['torch_"):
                with checker:
                    pass
            del kept
            self.assertFalse(checker.has_shm_files())

    # -- inheriting and autograd ---------------------------------------------------------

    def test_inherit_tensor(self):
        tensor = torch.zeros(5, 5).share_memory_()
        child = AddThree(tensor)
        child.start()
        self._join(child)
        self.assertEqual(child.exitcode, 0)
        self.assertEqual(tensor, torch.full((5, 5), 3.0), atol=0, rtol=0)

    @unittest.skipIf(sys.platform == "win32", "needs the fork start method")
    def test_autograd_errors(self):
        ctx = mp.get_context("fork")
        backward_once()  # autograd's threads now exist in this process
        if torch.cuda.is_available() or torch.backends.mps.is_available():
            with self.assertRaisesRegex(RuntimeError, r"Unable to handle autograd"):
                with ctx.Pool(3) as pool:
                    pool.map(backward_once, [1, 2, 3])
        else:  # CPU-only autograd has no device threads to lose in a fork
            with ctx.Pool(3) as pool:
                self.assertEqual(pool.map(backward_once, [1, 2, 3]), [1, 4, 9])

    @NEEDS_SPAWN
    def test_autograd_fine_with_spawn(self):
        backward_once()
        with mp.get_context("spawn").Pool(2) as pool:
            self.assertEqual(pool.map(backward_once, [1, 2, 3]), [1, 4, 9])

    def _test_autograd_sharing(self, tensor, ctx=mp, is_parameter=False):
        device = "cuda" if tensor.is_cuda else "cpu"
        ready, parent_changed, queue = ctx.Event(), ctx.Event(), ctx.Queue()
        child = ctx.Process(target=check_shared_autograd_state,
                            args=(queue, ready, parent_changed, device, is_parameter),
                            daemon=True)
        child.start()

        @torch.utils.hooks.unserializable_hook
        def hook(*unused):
            pass

        if tensor.requires_grad:
            tensor.register_hook(hook)  # must not prevent sending the tensor
        tensor._grad = torch.zeros(5, 5, device=device)
        queue.put(tensor)
        self.assertTrue(ready.wait(WAIT_S))
        tensor.data[0, 0] = 1000
        tensor.grad.data[:] = torch.full((5, 5), 4.0, device=device)
        parent_changed.set()
        self.assertTrue(queue.get(timeout=WAIT_S), "the child saw the wrong state")
        self.assertEqual(tensor.data, torch.ones(5, 5, device=device))
        self.assertEqual(tensor.grad.data, torch.full((5, 5), 4.0, device=device))
        self._join(child)

    def test_variable_sharing(self):
        for requires_grad in (True, False):
            self._test_autograd_sharing(
                torch.arange(1.0, 26).view(5, 5).requires_grad_(requires_grad))

    def test_leaf_variable_sharing(self):
        devices = ["cpu"] + (["cuda"] if TEST_CUDA_IPC and not NO_MULTIPROCESSING_SPAWN else [])
        for device in devices:
            for requires_grad in (True, False):
                tensor = torch.arange(1.0, 26, device=device).view(5, 5)
                tensor.requires_grad_(requires_grad)
                self.assertTrue(tensor.is_leaf)
                ctx = mp.get_context("spawn") if device == "cuda" else mp
                ready, queue = ctx.Event(), ctx.Queue()
                child = ctx.Process(target=report_requires_grad, args=(queue, ready),
                                    daemon=True)
                child.start()
                queue.put(tensor)
                self.assertTrue(ready.wait(WAIT_S))
                self.assertEqual(queue.get(timeout=WAIT_S), requires_grad)
                self._join(child)

    def test_non_leaf_variable_sharing(self):
        for device in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
            leaf = torch.arange(1.0, 26, device=device).view(5, 5).requires_grad_(True)
            with self.assertRaisesRegex(RuntimeError, r"requires_grad"):
                mp.SimpleQueue().put(leaf * 2)

    def test_parameter_sharing(self):
        self._test_autograd_sharing(Parameter(torch.arange(1.0, 26).view(5, 5)),
                                    is_parameter=True)

    @NEEDS_SPAWN
    def test_integer_parameter_serialization_cpu(self):
        self._test_integer_parameter_serialization("cpu")

    def _test_integer_parameter_serialization(self, device):
        param = Parameter(torch.tensor(0, dtype=torch.int64, device=device),
                          requires_grad=False)
        ctx = mp.get_context("spawn")
        queue, answers = ctx.Queue(), ctx.Queue()
        child = ctx.Process(target=receive_parameter, args=(queue, answers), daemon=True)
        child.start()
        queue.put(param)
        self.assertEqual(answers.get(timeout=WAIT_S), ("Parameter", torch.int64, False),
                         f"an integer Parameter on {device} did not arrive as one")
        self._join(child)
        self.assertEqual(child.exitcode, 0)

    # -- empty and shared tensors ---------------------------------------------------------

    def _test_empty_tensor_sharing(self, dtype, device):
        queue = mp.Queue()
        empty = torch.tensor([], dtype=dtype, device=device)
        queue.put(empty)
        self.assertEqual(queue.get(timeout=WAIT_S), empty)

    def test_empty_tensor_sharing(self):
        self._test_empty_tensor_sharing(torch.float32, torch.device("cpu"))
        self._test_empty_tensor_sharing(torch.int64, torch.device("cpu"))

    def test_empty_shared(self):
        torch.tensor([]).share_memory_()

    def _test_is_shared(self):
        tensor = torch.randn(5, 5)
        self.assertFalse(tensor.is_shared())
        tensor.share_memory_()
        self.assertTrue(tensor.is_shared())

    @NO_FD_STRATEGY
    def test_is_shared(self):
        self._test_is_shared()

    def test_fs_is_shared(self):
        with fs_sharing():
            self._test_is_shared()

    @unittest.skipIf(sys.platform != "linux", "thread names need prctl(2), Linux only")
    def test_set_thread_name(self):
        mp._set_thread_name("test name")
        self.assertEqual(mp._get_thread_name(), "test name")

    # -- CUDA (gated) ---------------------------------------------------------------------

    @NEEDS_SPAWN
    @NEEDS_CUDA_IPC
    def test_cuda_sharing(self):
        self._test_sharing(mp.get_context("spawn"), "cuda", torch.float)

    @unittest.skipIf(not torch.cuda.is_available(), "CUDA not available")
    def test_empty_tensor_sharing_cuda(self):
        self._test_empty_tensor_sharing(torch.float32, torch.device("cuda"))
        self._test_empty_tensor_sharing(torch.int64, torch.device("cuda"))

    @NEEDS_SPAWN
    @NEEDS_CUDA_IPC
    def test_cuda_variable_sharing(self):
        for requires_grad in (True, False):
            tensor = torch.arange(1.0, 26, device="cuda").view(5, 5)
            self._test_autograd_sharing(tensor.requires_grad_(requires_grad),
                                        mp.get_context("spawn"))

    @NEEDS_SPAWN
    @NEEDS_CUDA_IPC
    def test_cuda_parameter_sharing(self):
        self._test_autograd_sharing(Parameter(torch.arange(1.0, 26, device="cuda").view(5, 5)),
                                    mp.get_context("spawn"), is_parameter=True)

    @NEEDS_SPAWN
    @NEEDS_CUDA_IPC
    def test_integer_parameter_serialization_cuda(self):
        self._test_integer_parameter_serialization("cuda")

    @unittest.skipIf(not torch.cuda.is_available(), "CUDA not available")
    def test_is_shared_cuda(self):
        self.assertTrue(torch.randn(5, 5).cuda().is_shared())


if __name__ == "__main__":
    run_tests()
