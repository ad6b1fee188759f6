"""Diagnostics of the estimators that need no model: synthetic frontier, oracle alignment, QQ tail fit."""
