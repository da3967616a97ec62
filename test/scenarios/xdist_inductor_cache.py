"""Run under -n: torch.compile's on-disk cache stays where it is without xdist.

EXPECTED_CACHE, where set, is the cache folder the run names itself
(TORCHINDUCTOR_CACHE_DIR), which must be kept as it is.
"""

import getpass
import os
import tempfile


def test_the_compile_cache_outlives_the_worker():
    private = tempfile.gettempdir()  # the worker's, removed with it
    cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    if os.environ.get("EXPECTED_CACHE"):
        assert cache == os.environ["EXPECTED_CACHE"]
    else:
        # torch's default folder, in the temp folder the run was given
        assert os.path.basename(cache) == "torchinductor_" + getpass.getuser()
        assert not cache.startswith(private + os.sep), (cache, private)
        assert os.path.isdir(os.path.dirname(cache)) and private.startswith(
            os.path.dirname(cache) + os.sep), (cache, private)
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir
    except ImportError:  # where torch has it elsewhere: the variable is what it reads
        return
    assert cache_dir() == cache
