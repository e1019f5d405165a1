"""The version of FlowX, written here and nowhere else.

The build reads it (``[tool.hatch.version]`` in pyproject.toml) into the distribution's
metadata, ``flowx.__version__`` re-exports it, and ``flowx --version`` prints it; a test holds
the installed metadata to it, so the three cannot drift apart.
"""

__version__ = "0.1.0"
