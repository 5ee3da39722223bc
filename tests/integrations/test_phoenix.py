"""What a person sees in a real Arize Phoenix: a guarded agent's traces, read back through its API.

Phoenix runs from its own virtual environment (``.ci/run`` installs a pinned
``arize-phoenix`` there and sets ``GUARDSTACK_PHOENIX`` to its ``phoenix``
command), on loopback with free ports, its telemetry and external resources off,
and is stopped by its process id. Spans go over OTLP/HTTP through
``guardstack.integrations.otel.configure``; what Phoenix made of them is read back
through its REST API, and through GraphQL for the span's Input and Output.

Without Phoenix installed the tests skip, saying so; in CI (``CI`` set) a missing
Phoenix fails them instead.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from guardstack.guards import GENTLE_TEXT, RepeatToolReminder, ToolCallTimeoutPolicy
from guardstack.integrations.otel import configure
from guardstack.pipeline import Harness, ModelReply, ScriptedModel, ToolCallRequest, ToolDefinition
from guardstack.pipeline.decisions import GUARDRAIL_EVENT
from guardstack.wrappers import CONTEXT_EVENT, Retry, Timeout, Tracing

PHOENIX = os.environ.get("GUARDSTACK_PHOENIX")
STARTUP_S = 180  # the first start creates its database
INGEST_S = 30


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _get(url: str, data: bytes | None = None) -> Any:
    headers = {"content-type": "application/json"} if data is not None else {}
    request = urllib.request.Request(url, data=data, headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


class Phoenix:
    def __init__(self, command: str, directory: Path) -> None:
        self.port = _free_port()
        self.log = directory / "phoenix.log"
        environment = {
            **os.environ,
            "PHOENIX_HOST": "127.0.0.1",
            "PHOENIX_PORT": str(self.port),
            "PHOENIX_GRPC_PORT": str(_free_port()),
            "PHOENIX_WORKING_DIR": str(directory),
            "PHOENIX_TELEMETRY_ENABLED": "false",
            "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
        }
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [command, "serve"], env=environment, stdout=log, stderr=subprocess.STDOUT
            )
        self.started_s = self._wait_for_health()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _wait_for_health(self) -> float:
        started = time.monotonic()
        while time.monotonic() - started < STARTUP_S:
            if self.process.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as response:
                    if response.status == 200:
                        return time.monotonic() - started
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.stop()
        tail = self.log.read_text("utf-8", errors="replace")[-3000:]
        pytest.fail(f"Phoenix did not become healthy in {STARTUP_S} s:\n{tail}")

    def spans(self, project: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        cursor = ""
        while True:
            try:
                page = _get(f"{self.url}/v1/projects/{project}/spans?limit=1000{cursor}")
            except urllib.error.HTTPError as error:
                if error.code == 404:  # no span of the project ingested yet
                    return found
                raise
            found.extend(page["data"])
            if not page.get("next_cursor"):
                return found
            cursor = f"&cursor={page['next_cursor']}"

    def graphql(self, query: str) -> Any:
        return _get(f"{self.url}/graphql", json.dumps({"query": query}).encode())["data"]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    if not PHOENIX:
        if os.environ.get("CI"):
            pytest.fail("CI must run the Phoenix tests: GUARDSTACK_PHOENIX is not set")
        pytest.skip("Phoenix is not installed: set GUARDSTACK_PHOENIX to its `phoenix` command")
    server = Phoenix(PHOENIX, tmp_path_factory.mktemp("phoenix"))
    try:
        yield server
    finally:
        server.stop()


# -- the scenario ---------------------------------------------------------------------


async def grep(arguments: Any, call: Any) -> str:
    return f"src/app.py:12: {arguments['q']}"


async def fetch(arguments: Any, call: Any) -> str:
    await anyio.sleep(3600)
    return "never"


def ask(name: str, arguments: dict[str, Any]) -> ModelReply:
    return ModelReply(tool_calls=[ToolCallRequest(name, arguments)])


async def guarded_agent(endpoint: str, project: str) -> int:
    """Two turns: three identical greps (the reminder), then a fetch that times out twice."""
    os.environ["OTEL_RESOURCE_ATTRIBUTES"] = f"openinference.project.name={project}"
    try:
        telemetry = configure(
            service_name="guardstack-tests",
            traces_endpoint=f"{endpoint}/v1/traces",
            metrics=False,
            set_global=False,
        )
    finally:
        del os.environ["OTEL_RESOURCE_ATTRIBUTES"]
    model = ScriptedModel(
        [ask("grep", {"q": "TODO"})] * 3
        + [ModelReply("Found one TODO."), ask("fetch", {"url": "a"}), ModelReply("No answer.")]
    )
    harness = Harness(model=model, max_steps=10)
    harness.tools.register(ToolDefinition("grep", grep, "Search the code"))
    harness.tools.register(ToolDefinition("fetch", fetch, "Fetch a page", timeout_ms=100))
    harness.plugin(Tracing(telemetry.tracer_provider, capture_content=True))
    harness.plugin(Retry(attempts=2, backoff_ms=0))
    harness.plugin(ToolCallTimeoutPolicy())
    harness.plugin(RepeatToolReminder())
    harness.plugin(Timeout(ms=5_000, stage="model"))
    agent = harness.loop.create("phoenix-session")
    await agent.prompt("Find the TODOs")
    await agent.prompt("Fetch the page")
    telemetry.shutdown()
    return telemetry.failed_spans


EXPECTED_SPANS = 2 + 6 * 2 + 3 * 3 + 1 + 1 + 2  # turns, chats with their layer, calls


def _tree(spans: list[dict[str, Any]]) -> dict[str | None, list[dict[str, Any]]]:
    children: dict[str | None, list[dict[str, Any]]] = {}
    for span in sorted(spans, key=lambda span: span["start_time"]):
        children.setdefault(span["parent_id"], []).append(span)
    return children


async def test_a_guarded_agent_reads_well_in_phoenix(
    phoenix: Phoenix, anyio_backend_name: str
) -> None:
    project = f"guardstack-{anyio_backend_name}"
    assert await guarded_agent(phoenix.url, project) == 0
    deadline = time.monotonic() + INGEST_S
    spans = phoenix.spans(project)
    while len(spans) < EXPECTED_SPANS and time.monotonic() < deadline:
        await anyio.sleep(0.2)
        spans = phoenix.spans(project)
    assert len(spans) == EXPECTED_SPANS

    # one trace per turn, each an AGENT root
    children = _tree(spans)
    roots = children[None]
    assert [root["name"] for root in roots] == ["invoke_agent phoenix-session"] * 2
    assert [root["span_kind"] for root in roots] == ["AGENT", "AGENT"]
    assert len({span["context"]["trace_id"] for span in spans}) == 2

    # invoke_agent -> chat / execute_tool, in the order they happened
    first, second = ([c["name"] for c in children[r["context"]["span_id"]]] for r in roots)
    assert first == ["chat", "execute_tool grep"] * 3 + ["chat"]
    assert second == ["chat", "execute_tool fetch", "chat"]

    # layers nest in registration order; the retried layer shows once per attempt
    def below(span: dict[str, Any]) -> list[Any]:
        return [
            (child["name"], child["attributes"].get("guardstack.attempt"), below(child))
            for child in children.get(span["context"]["span_id"], [])
        ]

    by_name: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        by_name.setdefault(span["name"], []).append(span)
    assert below(by_name["execute_tool grep"][0]) == [
        ("retry", 1, [("tool-call-timeout-policy", 1, [])])
    ]
    [fetched] = by_name["execute_tool fetch"]
    assert below(fetched) == [
        ("retry", 1, [("tool-call-timeout-policy", 1, []), ("tool-call-timeout-policy", 2, [])])
    ]
    assert all(below(chat) == [("timeout", 1, [])] for chat in by_name["chat"])

    # exactly one TOOL span per tool call; layers are not tools
    tools = [span for span in spans if span["span_kind"] == "TOOL"]
    assert (
        sorted(span["name"] for span in tools) == ["execute_tool fetch"] + ["execute_tool grep"] * 3
    )
    assert {span["span_kind"] for span in by_name["retry"]} == {"UNKNOWN"}

    # the timeout: ERROR with its error.type, on the call and on each layer that returned it
    assert fetched["status_code"] == "ERROR"
    assert fetched["attributes"]["error.type"] == "TOOL_TIMEOUT"
    assert fetched["status_message"] == "tool call timed out after 100ms"

    # the reminder, as an event on the third grep — and as the GenAI conventions'
    # guardrail result (the layer's decision: remind)
    greps = sorted(by_name["execute_tool grep"], key=lambda span: span["start_time"])
    assert [sorted(event["name"] for event in span["events"]) for span in greps] == [
        [],
        [],
        sorted([CONTEXT_EVENT, GUARDRAIL_EVENT]),
    ]
    [context] = [e for e in greps[2]["events"] if e["name"] == CONTEXT_EVENT]
    assert context["attributes"]["guardstack.context.text"] == GENTLE_TEXT
    [guardrail] = [e for e in greps[2]["events"] if e["name"] == GUARDRAIL_EVENT]
    assert guardrail["attributes"]["gen_ai.guardrail.result.value"] == "remind"

    # content capture: the call's arguments and result as Phoenix's Input and Output
    project_id = next(
        edge["node"]["id"]
        for edge in phoenix.graphql("{ projects { edges { node { name id } } } }")["projects"][
            "edges"
        ]
        if edge["node"]["name"] == project
    )
    query = (
        f'{{ node(id: "{project_id}") {{ ... on Project {{ spans(first: 100) '
        "{ edges { node { name spanKind input { value } output { value } } } } } } }"
    )
    nodes = [edge["node"] for edge in phoenix.graphql(query)["node"]["spans"]["edges"]]
    shown = {(n["name"], n["input"]["value"], n["output"]["value"]) for n in nodes if n["input"]}
    assert shown == {
        ("execute_tool grep", '{"q": "TODO"}', "src/app.py:12: TODO"),
        ("execute_tool fetch", '{"url": "a"}', "Error: tool call timed out after 100ms"),
    }
    # and the model's messages, converted by Phoenix from the GenAI conventions
    first_chat = min(by_name["chat"], key=lambda span: span["start_time"])
    assert first_chat["attributes"]["llm.input_messages.0.message.content"] == "Find the TODOs"
