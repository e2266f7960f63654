"""``python -m trioq._cli``: the ``trioq`` command (workers of ``serve --processes`` run so)."""

import sys

from .main import main

sys.exit(main())
