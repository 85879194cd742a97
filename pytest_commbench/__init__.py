"""pytest-commbench: a benchmark of GPU communication code, one pytest item per task."""

from __future__ import annotations

__version__ = "0.1.0"
