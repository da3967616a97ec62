"""A pytest plugin (``-p distspawn_first``) that imports distspawn at start-up,
before ``--distspawn-stand-in`` has set the variable that asks for the mode."""

import distspawn  # noqa: F401
