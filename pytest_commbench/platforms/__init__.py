"""Platforms: where tasks run and how (vendor, compiler, interconnect, launcher)."""

from __future__ import annotations

from ..profiles import NAMES, PROFILES, GpuProfile
from .base import Platform
from .cpu import CpuPlatform
from .gpu import GENERIC, GpuPlatform, generic_profile
from .gpu import detect as detect_gpu


def make(name: str) -> Platform | None:
    if name == "cpu":
        return CpuPlatform()
    if name in PROFILES:
        return GpuPlatform(PROFILES[name])
    for vendor, generic in GENERIC.items():
        if name == generic:
            profile = generic_profile(vendor)
            if profile is None:
                raise ValueError(f"platform {name} is made from this machine's {vendor} GPUs, "
                                 "and there are none")
            return GpuPlatform(profile)
    return None


def detect() -> str:
    """The platform `auto` stands for on this machine: its GPUs' profile, else cpu."""
    return detect_gpu() or "cpu"


__all__ = ["GENERIC", "NAMES", "PROFILES", "CpuPlatform", "GpuPlatform", "GpuProfile", "Platform", "detect",
           "make"]
