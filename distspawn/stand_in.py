"""``python -m distspawn.stand_in TEST_FILE.py [ARGS]``: a file written for
upstream's harness, run unchanged on distspawn's engine (the zero-change mode;
see :mod:`distspawn.integrations.stand_in`). Under pytest the same mode is
``pytest --distspawn-stand-in``."""

from .integrations.stand_in import StandInWarning, install, installed, main, requested

__all__ = ["StandInWarning", "install", "installed", "main", "requested"]

if __name__ == "__main__":
    raise SystemExit(main())
