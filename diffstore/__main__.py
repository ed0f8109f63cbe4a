"""``python -m diffstore``: the same as the ``diffstore`` command."""

import sys

from diffstore.cli import main

sys.exit(main())
