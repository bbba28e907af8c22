"""quire: a Gazette-style journal broker."""

__version__ = "0.1.0"
