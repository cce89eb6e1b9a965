"""The agent-facing MCP server: exactly the environment's tools, over streamable HTTP at /mcp."""

from __future__ import annotations

from typing import Any

from fastmcp import FastMCP
from fastmcp.tools.base import Tool, ToolResult
from mcp.types import TextContent

from envserver.instance import EnvInstance
from envserver.tools import ToolFailure, render


class BundleTool(Tool):
    """A tool whose schema comes from the bundle and whose body runs in the instance."""

    instance: Any = None

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        try:
            result = await self.instance.call_tool(self.name, arguments)
        except ToolFailure as failure:
            # Errors are results (isError), not protocol errors: the agent reads and recovers.
            return ToolResult(content=[TextContent(type="text", text=str(failure))], is_error=True,
                              meta={"awm_error": failure.kind})
        structured = result if isinstance(result, dict) else {"result": result}
        return ToolResult(content=[TextContent(type="text", text=render(result))],
                          structured_content=structured)


def build_mcp(instance: EnvInstance) -> FastMCP:
    bundle = instance.bundle
    server = FastMCP(name=bundle.name, instructions=bundle.scenario.description,
                     mask_error_details=False)
    for spec in bundle.tools:
        server.add_tool(BundleTool(name=spec.name, description=spec.description,
                                   parameters=spec.input_schema, instance=instance))
    return server
