"""``python -m distspawn``: the matrix runner (:mod:`distspawn.integrations.matrix`);
``python -m distspawn --version`` says which distspawn, torch and Python run."""

from .integrations.matrix import main

raise SystemExit(main())
