"""``python -m jagflash.bench``: see :mod:`jagflash.bench.cli`."""

import sys

from jagflash.bench.cli import main

sys.exit(main())
