"""The gateways: guards for agents you cannot change, at their base URLs.

* ``guardstack.gateway.model_proxy`` — the model proxy: every provider's API behind one
  URL (chat completions, Responses, Messages, Gemini), each request routed to its
  upstream and run through the guard stack;
* ``guardstack.gateway.mcp_gateway`` — the MCP gateway: many MCP servers behind one
  endpoint, each call through the stack;
* what they share — ``tenants`` (the tenants file: keys, teams, budgets), ``budgets``
  (every scope's windows, reserved before and settled after), ``admin`` (the operators'
  routes), ``spend`` (the report), ``decision_log`` (one line per decision).

It depends on ``integrations``, ``guards``, ``wrappers`` and ``pipeline``; only the CLI
depends on it (the import contract, ``pyproject.toml``).
"""
