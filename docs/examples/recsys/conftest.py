"""The example is a folder of scripts, not a package: its tests import recsys.py from here."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
