"""Agent integrations: how users meet corral inside their agent.

* :mod:`.claude_code_hook` - the Claude Code ``PreToolUse`` hook (``corral hook claude-code``);
* :mod:`.claude_settings` - ``corral install claude-code``: merge the hook into settings.json;
* :mod:`.plugin_wrap` - ``corral wrap-plugin``: another plugin's hooks and MCP servers in corral;
* :mod:`.mcp_server` - ``corral mcp``: the MCP server over stdio.

None of them has policy logic of its own: commands run through
:mod:`corral.pipeline._runner` (or ``corral run``), and paths are judged by
:mod:`._access` from the same :class:`~corral.policy.Policy`.
"""
