"""jagflash core: what every variant shares. Importing it queries no GPU.

The front door, :func:`attention`, sends a problem to the best installed variant.
"""

from jagflash.core.capability import InvalidInput, UnsupportedProblem
from jagflash.core.registry import attention, variants

__all__ = ["InvalidInput", "UnsupportedProblem", "attention", "variants"]
