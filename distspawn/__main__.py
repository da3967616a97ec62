"""``python -m distspawn``: see :mod:`distspawn.matrix`."""

from .matrix import main

raise SystemExit(main())
