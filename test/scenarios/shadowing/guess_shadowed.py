"""The guess_shadowed found once this folder is first in sys.path (test_warm_ranks)."""
