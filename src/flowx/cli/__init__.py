"""The ``flowx`` command."""
