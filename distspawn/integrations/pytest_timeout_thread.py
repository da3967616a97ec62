"""pytest-timeout's thread method, with the ranks shown before the process ends.

That method's timer thread prints the test process's stacks and ends it with
``os._exit``: nothing of the test's own runs again, so the note distspawn adds
to the signal method's exception (each running rank's stack, the collective
it waits in) would never be seen. For the thread method distspawn sets the
timer itself, through the plugin's ``pytest_timeout_set_timer`` hook: on
expiry it prints where the ranks are, then hands over to the plugin's own
expiry (its stacks, its exit). Where no rank runs, only the plugin's part runs.
"""

from __future__ import annotations

import inspect
import sys
import threading
from typing import Any, Callable

from ..engine.supervisor import where_watched_ranks_are

RANKS_TITLE = "distspawn: where this test's ranks are"


def set_thread_timer(item: Any, settings: Any) -> bool | None:
    """Set the timer for the thread method and return True; None leaves the
    timer to pytest-timeout (the signal method, or a release of it whose
    expiry function is not the one this knows)."""
    method = getattr(settings, "method", None)
    # The plugin falls back to the thread method off the main thread.
    if method == "signal" and threading.current_thread() is not threading.main_thread():
        method = "thread"
    if method != "thread" or not getattr(settings, "timeout", None):
        return None  # every test of a run on the signal method: nothing more to look up
    plugin = sys.modules.get("pytest_timeout")
    expire = _plugins_expiry(plugin, settings)
    if expire is None:
        return None

    def on_expiry() -> None:
        if not _debugging(plugin, settings):  # the plugin's expiry does nothing then
            _show_ranks(item)
        expire(item)

    timer = threading.Timer(settings.timeout, on_expiry)
    timer.name = f"distspawn pytest-timeout {item.nodeid}"

    def cancel() -> None:
        timer.cancel()
        timer.join()

    # The plugin's pytest_timeout_cancel_timer calls this.
    item.cancel_timeout = cancel
    timer.start()
    return True


def _plugins_expiry(plugin: Any, settings: Any) -> Callable[[Any], None] | None:
    """pytest-timeout's thread-method expiry for one item: ``timeout_timer``
    takes the settings from 2.2 on, the timeout before."""
    expiry = getattr(plugin, "timeout_timer", None)
    try:
        second = list(inspect.signature(expiry).parameters)[1:2]
    except (TypeError, ValueError):
        return None
    if second == ["settings"]:
        return lambda item: expiry(item, settings)
    if second == ["timeout"]:
        return lambda item: expiry(item, settings.timeout)
    return None


def _debugging(plugin: Any, settings: Any) -> bool:
    is_debugging = getattr(plugin, "is_debugging", None)
    if is_debugging is None or getattr(settings, "disable_debugger_detection", False):
        return False
    try:
        return bool(is_debugging())
    except Exception:
        return False


def _show_ranks(item: Any) -> None:
    note = where_watched_ranks_are()
    if not note:
        return
    try:
        # Printed past pytest's capture, as the plugin prints its stacks next.
        capture = item.config.pluginmanager.getplugin("capturemanager")
        if capture is not None:
            capture.suspend_global_capture(item)
        terminal = item.config.get_terminal_writer()
        terminal.sep("+", title=RANKS_TITLE)
        terminal.write(note + "\n")
        terminal.flush()
    except Exception:
        # The plugin's own report must still come, whatever went wrong here.
        sys.stderr.write(f"{RANKS_TITLE}\n{note}\n")
        sys.stderr.flush()
