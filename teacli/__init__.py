"""tea: post-train language models for best-of-N deployment (TEA / Prefix-TEA)."""

__version__ = "0.1.0"
