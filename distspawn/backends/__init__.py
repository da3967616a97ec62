"""The in-process ``threaded`` process group: rendezvous of calls, the torch adapter, the per-thread world."""
