"""``python -m distspawn``: see :mod:`distspawn.matrix`."""

from .integrations.matrix import main

raise SystemExit(main())
