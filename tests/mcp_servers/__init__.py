"""MCP servers the tests start as real processes (stdio or streamable HTTP), written with the SDK."""
