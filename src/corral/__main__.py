"""``python -m corral``: the same as the ``corral`` command."""

import sys

from .cli import main

sys.exit(main())
