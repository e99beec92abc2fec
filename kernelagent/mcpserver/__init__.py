"""`kernelagent mcp`: the harness as an MCP server, for any coding agent (Claude Code, Cursor, ...).

    session.py  roots, per-session budgets, argument errors (no MCP import)
    server.py   the MCPServer: tools (the agent's own implementations), resources, prompts
"""
