"""Agent frameworks on Charter: clients of the public face only (MCP so far)."""
