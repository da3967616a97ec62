"""A pytest plugin (``-p count_server_starts``) that counts the rank server's starts.

Every start goes through ``distspawn_rank_server.start_server``; the count is
printed at the end of the run as ``rank server starts: N``.
"""

import distspawn_rank_server

_starts = []
_start_server = distspawn_rank_server.start_server


def _counted(*args, **kwargs):
    _starts.append(args)
    return _start_server(*args, **kwargs)


distspawn_rank_server.start_server = _counted


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(f"rank server starts: {len(_starts)}")
