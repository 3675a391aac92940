"""varpack: plan variable-length training offline.

The flow is ``lengths -> sort -> plan -> inspect/validate -> torch reader``; see README.md.
Everything here imports without torch; only :mod:`varpack.torch` needs it.
"""

from varpack.errors import VarpackError

__version__ = "0.1.0"
__all__ = ["VarpackError", "__version__"]
