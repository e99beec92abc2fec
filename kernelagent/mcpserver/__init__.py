"""`kernelagent mcp`: the harness as an MCP server, for any coding agent (Claude Code, Cursor, ...).

The server is a trust boundary: it trusts problems only from its --problems folders, as they
were when it started, and nothing a client sends or names (docs/concepts/isolation.md).

    session.py    budgets per client session, reserved at admission (no MCP import)
    roots.py      pinned problems, paths confined to the roots, bounded reads (no MCP import)
    confined.py   problem code the server runs itself: a child, allowlisted environment, jailed
    manifests.py  the verify tool: a manifest checked before anything it names is touched
    http_app.py   `--http`: the SDK's app behind the guard and limits `serve` shares (kernelagent/serving)
    calls.py      one call's run: admitted against its budget, cancelled alone
    server.py     the MCPServer: tools (the agent's own implementations), resources, prompts
"""
