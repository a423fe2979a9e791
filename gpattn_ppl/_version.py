"""The library version (one place; the package root and the run manifest read it)."""

__version__ = "0.1.0"
