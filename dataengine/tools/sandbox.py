"""Sandboxed tool execution: `Sandbox`, a pool of reusable worker processes with limits.

The parent side lives in dataengine.tools.pool, the code that runs inside the workers in
dataengine.tools.worker and the Linux isolation primitives in dataengine.tools.isolation;
this module keeps the public names importable from their historical place.
"""

from __future__ import annotations

from dataengine.tools.pool import CallItem, Sandbox, ToolboxLoadError
from dataengine.tools.worker import CpuLimitExceeded, Limits

__all__ = ["CallItem", "CpuLimitExceeded", "Limits", "Sandbox", "ToolboxLoadError"]
