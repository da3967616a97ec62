"""A pytest plugin (``-p upstream_first``) that imports upstream's DTensor base at
start-up, before distspawn's zero-change mode could stand in for its harness."""

import torch.testing._internal.distributed._tensor.common_dtensor  # noqa: F401
