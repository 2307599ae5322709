"""One OpenAI Agents SDK run against Shoal, for the chat and Responses tool tests: an agent
with one function tool, forced to call it, stopping at the first call
(`stop_on_first_tool`: what the tiny model would say next is not the point)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def assert_agent_calls_add(model: Callable[[Any], Any]) -> None:
    """`model(client)` builds the Agents SDK model around an openai client; the agent must
    read Shoal's call, run the Python function with the parsed arguments, and return what
    it returned."""
    import openai
    from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # no exporter can reach OpenAI from here
    seen: list[tuple[int, int]] = []

    @function_tool
    def add(a: int, b: int) -> str:
        """Add two integers."""
        seen.append((a, b))
        return str(a + b)

    agent = Agent(
        name="adder",
        instructions="Use the add tool to add numbers.",
        model=model(openai.AsyncOpenAI),
        model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=60),
        tools=[add],
        tool_use_behavior="stop_on_first_tool",
    )
    result = Runner.run_sync(agent, "What is 2 plus 3?", max_turns=2)
    [(a, b)] = seen
    assert result.final_output == str(a + b)
