"""Where solutions come from: built-in models, pre-generated directories, and (through the
`pytest_commbench_make_model` hook) anything a third party registers."""

from __future__ import annotations

from .base import Candidate, Model, Reply
from .builtin import make_builtin

__all__ = ["Candidate", "Model", "Reply", "make_builtin"]
