"""The target GPU as a typed value: its `hw.GpuProfile`, loaded once per build from the settings'
hw directory (a custom XG_HW_DIR included) and handed down to tuning and packaging.
"""

from __future__ import annotations

from ..hw import GpuProfile, load_profile
from ..settings import Settings


def target_profile(name: str, settings: Settings | None = None) -> GpuProfile:
    """The profile of `name` (any of its aliases) in `settings.hw_dir` (no settings: the built-in profiles)."""
    return load_profile(name, settings.hw_dir if settings is not None else None)
