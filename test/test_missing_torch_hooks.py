"""Private torch hooks distspawn uses only if present: runs without them stay correct."""

from harness import run_python


def test_ranks_run_and_report_without_the_fatal_signal_hook():
    run = run_python(["missing_torch_hooks.py", "-v"], timeout=300)
    assert run.returncode == 1, run.output
    assert run.verdict_line("test_all_reduce").endswith("ok")
    assert run.verdict_line("test_default_device_type").endswith("ok")
    assert run.verdict_line("test_fails_with_a_report").endswith("FAIL")
    assert "RuntimeError: reported without the fatal-signal hook" in \
        run.report("test_fails_with_a_report")
    assert run.leftover_pids == [] and run.leftover_files == []
