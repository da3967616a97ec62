"""As pytest's own import of readline does with COLUMNS and LINES: a variable
set in the process's C-level environment that ``os.environ`` never shows."""

import os

os.putenv("REGISTERING_DRIFT", "C-level only")
