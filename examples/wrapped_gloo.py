"""A third-party backend, as a plugin would ship one: gloo behind a Python ProcessGroup.

``register("wrapped_gloo")`` makes ``init_process_group("wrapped_gloo")`` work and
tells the conformance suite which features it has (all of gloo's). Every
operation is handed to a real gloo group, so the suite passes on it.
``register("dropping_gloo", drop_rank=1)`` registers a deliberately broken
variant whose all_reduce loses that rank's data: the conformance suite must
catch it (``examples/test_plugin_backend.py``).
"""

from __future__ import annotations

import torch.distributed as dist

from distspawn import DistTestCases

# Operations torch.distributed calls on a process group -> gloo's name for each.
_FORWARDED = {
    name: name for name in (
        "allreduce_coalesced", "broadcast", "reduce", "allgather", "allgather_coalesced",
        "gather", "scatter", "reduce_scatter", "alltoall", "barrier", "send", "recv",
        "recv_anysource")
}
_FORWARDED.update({
    "all_gather_single": "_allgather_base", "_allgather_base": "_allgather_base",
    "reduce_scatter_single": "_reduce_scatter_base",
    "_reduce_scatter_base": "_reduce_scatter_base",
    "all_to_all_single": "alltoall_base", "alltoall_base": "alltoall_base",
})


def _forward(name, inner_name):
    def method(self, *args, **kwargs):
        return getattr(self.inner, inner_name)(*args, **kwargs)

    method.__name__ = name
    return method


class WrappedGloo(dist.ProcessGroup):
    """A process group that runs every operation on an inner gloo group."""

    backend_name = "wrapped_gloo"
    drop_rank: int | None = None

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self.inner = dist.ProcessGroupGloo(store, rank, size, timeout)

    def getBackendName(self):  # noqa: N802 - torch's name
        return self.backend_name

    # torch names each group it creates; a Python group keeps the name itself.
    @property
    def group_name(self):
        return self._group_name

    def _set_group_name(self, name):
        self._group_name = name

    # torch >= 2.14's batch_isend_irecv asks a group for its per-device backend
    # and fails on a Python group, which has none: this group answers for
    # itself, and the flag keeps torch on its plain isend/irecv path.
    supports_coalescing = False
    supports_splitting = False

    def _get_backend(self, device):
        return self

    def allreduce(self, tensors, opts=None):
        if opts is None:
            opts = dist.AllreduceOptions()
        if self.rank() == self.drop_rank:
            for tensor in tensors:  # the bug: this rank's data never reaches the others
                tensor.zero_()
        return self.inner.allreduce(tensors, opts)


for _name, _inner_name in _FORWARDED.items():
    setattr(WrappedGloo, _name, _forward(_name, _inner_name))


def register(name: str = "wrapped_gloo", drop_rank: int | None = None) -> None:
    """Register ``name`` with torch.distributed and with the conformance suite's tables."""
    if name in dist.Backend.backend_list:
        return
    group_class = type(name, (WrappedGloo,), {"backend_name": name, "drop_rank": drop_rank})

    def create(store, rank, size, timeout):
        return group_class(store, rank, size, timeout)

    dist.Backend.register_backend(name, create, devices=["cpu"])
    # A plugin declares itself, then every feature it shares with gloo.
    DistTestCases.backend_feature["plugin"].add(name)
    for feature, backends in DistTestCases.backend_feature.items():
        # torch runs monitored_barrier only on a group whose backend is named gloo.
        if "gloo" in backends and feature != "monitored_barrier":
            backends.add(name)
    for backends in DistTestCases.skip_collective.values():
        if "gloo" in backends:
            backends.add(name)
