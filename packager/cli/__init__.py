"""The edgepack command line: parse, call the library, print. Errors become one line.

One module per command group; each registers its commands on the `main` group of base.py.
"""

from . import device, fleet, jobs, stages  # noqa: F401  (registers the commands)
from .base import main

__all__ = ["main"]
