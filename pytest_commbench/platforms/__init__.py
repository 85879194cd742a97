"""Platforms: where tasks run and how (vendor, compiler, interconnect, launcher).

`base.Platform` is what the engine asks of any platform; `gpu.GpuPlatform` what GPU platforms
share (profile, shared placement, features, leases); `nvidia.NvidiaPlatform` and
`amd.AmdPlatform` are the vendors' parts. `make(name)` turns a name into a platform and
`detect()` names this machine's."""

from __future__ import annotations

from ..profiles import NAMES, PROFILES, GpuProfile
from . import amd, nvidia
from .base import Platform
from .cpu import CpuPlatform
from .gpu import GENERIC, GpuPlatform

VENDOR_PLATFORMS = {"nvidia": nvidia.NvidiaPlatform, "amd": amd.AmdPlatform}
VENDOR_MODULES = {"nvidia": nvidia, "amd": amd}


def platform_of(profile: GpuProfile) -> GpuPlatform:
    return VENDOR_PLATFORMS[profile.vendor](profile)


def generic_profile(vendor: str) -> GpuProfile | None:
    """A profile made from this machine's GPUs of `vendor`, where no profile names them."""
    return VENDOR_MODULES[vendor].generic_profile()


def make(name: str) -> Platform | None:
    if name == "cpu":
        return CpuPlatform()
    if name in PROFILES:
        return platform_of(PROFILES[name])
    for vendor, generic in GENERIC.items():
        if name == generic:
            profile = generic_profile(vendor)
            if profile is None:
                raise ValueError(f"platform {name} is made from this machine's {vendor} GPUs, "
                                 "and there are none")
            return platform_of(profile)
    return None


def detect_gpu() -> str | None:
    """The profile name of this machine's GPUs (NVIDIA's first), or None."""
    return nvidia.detect() or amd.detect()


def detect() -> str:
    """The platform `auto` stands for on this machine: its GPUs' profile, else cpu."""
    return detect_gpu() or "cpu"


__all__ = ["GENERIC", "NAMES", "PROFILES", "CpuPlatform", "GpuPlatform", "GpuProfile", "Platform",
           "amd", "detect", "detect_gpu", "generic_profile", "make", "nvidia", "platform_of"]
