"""The poison value of outputs (defined in the protocol both wings share)."""

from .rank.protocol import poison_value

__all__ = ["poison_value"]
