"""A pytest plugin (``-p count_server_starts``) that counts the rank server's starts.

Every start goes through ``distspawn_rank_server.start_server``; the count is
printed at the end of the run as ``rank server starts: N``, and how many of
them came before the test process imported torch (the early start, while
pytest imports the first test file) as ``before torch: M``.
"""

import sys

import distspawn.early.rank_server_boot as distspawn_rank_server

_starts = []
_start_server = distspawn_rank_server.start_server


def _counted(*args, **kwargs):
    _starts.append("torch" not in sys.modules)
    return _start_server(*args, **kwargs)


distspawn_rank_server.start_server = _counted


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(
        f"rank server starts: {len(_starts)}, before torch: {sum(_starts)}")
