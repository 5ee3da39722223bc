"""Moved to ``guardstack.gateway.spend`` in 0.2; this path warns until 0.3."""

from guardstack.integrations._moved import moved

__getattr__ = moved(__name__, "guardstack.gateway.spend")
