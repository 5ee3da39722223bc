"""MCP servers that misbehave, for the tests: ``python -m tests.integrations.hostile_mcp_server
MODE PID_FILE``.

* ``endless-cursor`` — ``tools/list`` always answers with a next cursor (a new one each page);
* ``same-cursor`` — ``tools/list`` answers the same next cursor forever;
* ``duplicates`` — two tools under one name;
* ``silent`` — reads its input and never answers anything, not even ``initialize``;
* ``names`` — tools named with what clients refuse in a name (a space, dots, ``/``,
  letters outside ASCII, ``;``, a newline, 80 characters), two of which map alike;
  each call answers the name it was called by.

Each writes its pid to PID_FILE first, so a test can check the process is gone.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

MODE = sys.argv[1] if __name__ == "__main__" else ""
if __name__ == "__main__":
    Path(sys.argv[2]).write_text(str(os.getpid()), "utf-8")
_pages = itertools.count(1)
ODD_NAMES = [
    "has space", "dots.in.name", "slash/name", "ünïcode", "semi;colon", "names_new\nline",
    "plain_name", "same.name", "same/name", "x" * 80,
]  # fmt: skip


def _tool(name: str) -> types.Tool:
    return types.Tool(name=name, input_schema={"type": "object", "properties": {}})


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    if MODE == "duplicates":
        return types.ListToolsResult(tools=[_tool("twin"), _tool("twin")])
    if MODE == "names":
        return types.ListToolsResult(tools=[_tool(name) for name in ODD_NAMES])
    cursor = "again" if MODE == "same-cursor" else f"page-{next(_pages)}"
    return types.ListToolsResult(tools=[_tool(f"t-{cursor}")], next_cursor=cursor)


async def call_tool(ctx: Any, params: Any) -> types.CallToolResult:
    text = params.name if MODE == "names" else "ok"
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


async def main() -> None:
    server: Any = Server("hostile", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    if MODE == "silent":
        for _ in sys.stdin:  # never answers; ends when its input closes
            pass
        time.sleep(60)  # ... and even then lingers, as a hung server would
    else:
        anyio.run(main)
