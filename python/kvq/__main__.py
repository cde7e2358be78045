"""``python -m kvq`` runs the ``kvq`` command."""

import sys

from .cli import main

sys.exit(main())
