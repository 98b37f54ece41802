"""The client helpers are not part of the gateway package: apps copy or vendor them."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "clients" / "python"))
