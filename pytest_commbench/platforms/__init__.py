"""Platforms: where tasks run and how (vendor, compiler, interconnect, launcher)."""

from __future__ import annotations

from .base import Platform
from .cpu import CpuPlatform

BUILTIN = {"cpu": CpuPlatform}


def detect() -> str:
    """The platform `auto` stands for on this machine."""
    return "cpu"


__all__ = ["BUILTIN", "CpuPlatform", "Platform", "detect"]
