"""Imported by guessed_imports/ranks_a.py, from this folder (its conftest adds
it to sys.path); shadowing/ holds another module of this name, found first
once that folder is put before this one."""
