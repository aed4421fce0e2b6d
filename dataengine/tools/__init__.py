"""Tools: registration with derived JSON schemas, and sandboxed execution."""

from dataengine.tools.registry import Tool, Toolbox, get_toolbox, register_toolbox, tool_from_callable

__all__ = ["Tool", "Toolbox", "get_toolbox", "register_toolbox", "tool_from_callable"]
