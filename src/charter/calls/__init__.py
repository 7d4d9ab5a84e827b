"""Calls made through the MCP gateway (G3): a client's call identity and the run carrying it."""
