"""What runs before torch is imported, on the standard library alone.

pytest loads every installed plugin for every run, so the registered plugin
(:mod:`distspawn.early.plugin`) must cost nothing; the rank server's first
preload (:mod:`distspawn.early.rank_server_boot`) must run before anything
imports torch, so that every later import sees the test process's environment
and its reads are recorded; the plugin reads test files' source
(:mod:`distspawn.early.source_scan`) before pytest imports them. The package
``__init__`` above is lazy (it imports no subpackage until a name is asked
for), so importing these imports nothing else of distspawn; test/test_layout.py
checks that none of them imports torch or a distspawn module outside this
folder.
"""
