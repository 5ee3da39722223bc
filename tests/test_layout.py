"""The source stays a structure the next engineer can live in (STYLE.md, 19)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGES = ("pipeline", "guards", "wrappers", "integrations", "gateway", "cli")
#: A module past this many lines is doing several jobs: split it by job.
MOST_LINES = 600


def test_no_module_is_over_600_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): lines
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if (lines := len(path.read_text("utf-8").splitlines())) > MOST_LINES
    }
    assert long == {}


def test_every_source_package_has_a_test_package() -> None:
    """Tests mirror the packages: ``tests/<package>/`` for each."""
    for package in PACKAGES:
        assert (ROOT / "tests" / package / "__init__.py").exists(), package


#: Modules whose behaviour is tested where it can be observed, not in a file of their
#: own: each with the test files that exercise it. A module in neither place fails
#: ``test_every_module_has_its_tests``; an entry whose module gains its own mirrored file,
#: or whose files are gone, fails ``test_the_map_of_tests_is_current``.
MIRRORED_BY: dict[str, tuple[str, ...]] = {
    # The command line's servers and demo: run as a user runs them, against real peers.
    "cli/demo.py": ("tests/cli/test_main.py",),
    "cli/demo_gateway.py": ("tests/cli/test_main.py",),
    "cli/parsing.py": ("tests/cli/test_main.py", "tests/gateway/model_proxy/test_command.py"),
    # What wraps each proxied request, and the metrics endpoint: as operators see them.
    "gateway/model_proxy/around.py": (
        "tests/gateway/model_proxy/test_app.py",
        "tests/gateway/test_request_log.py",
    ),
    "gateway/metrics_endpoint.py": ("tests/gateway/test_request_log.py",),
    "gateway/budget_values.py": ("tests/gateway/test_budgets.py", "tests/gateway/test_admin.py"),
    "gateway/model_proxy/replies.py": (
        "tests/gateway/test_budgets.py",
        "tests/gateway/model_proxy/test_app.py",
    ),
    "gateway/model_proxy/bodies.py": (
        "tests/gateway/model_proxy/test_wires.py",
        "tests/gateway/model_proxy/test_shapes.py",
    ),
    "cli/mcp_gateway.py": ("tests/gateway/mcp_gateway/test_server.py",),
    "cli/mcp_proxy.py": ("tests/integrations/test_mcp_proxy.py",),
    "cli/model_proxy.py": (
        "tests/gateway/model_proxy/test_app.py",
        "tests/gateway/model_proxy/test_command.py",
    ),
    "cli/watch.py": ("tests/pipeline/test_reload.py",),
    # The caps' shared accounting: through the caps that use it.
    "guards/_accounts.py": (
        "tests/guards/test_tool_call_limit.py",
        "tests/guards/test_model_call_limit.py",
    ),
    # LoopDetector's parts: only the detector's verdicts mean anything to a user.
    "guards/loop_detector/entry.py": ("tests/guards/loop_detector/test_detector.py",),
    "guards/loop_detector/patterns.py": (
        "tests/guards/loop_detector/test_detector.py",
        "tests/guards/loop_detector/test_generalises.py",
    ),
    "guards/loop_detector/watcher.py": ("tests/guards/loop_detector/test_real_traffic.py",),
    "guards/loop_detector/text_watch.py": ("tests/guards/loop_detector/test_text.py",),
    # A usage limit's parts: through the limit.
    "guards/usage_downgrade.py": ("tests/guards/test_model_call_limit.py",),
    "guards/usage_windows.py": ("tests/guards/test_model_call_limit.py",),
    "integrations/_sqlite_rows.py": ("tests/integrations/test_sqlite.py",),
    "gateway/model_proxy/closing.py": ("tests/gateway/model_proxy/test_text_loops.py",),
    "gateway/spend.py": ("tests/cli/test_spend.py", "tests/gateway/test_budgets.py"),
    # What operators do to budgets: through the admin routes.
    "gateway/budget_operators.py": ("tests/gateway/test_admin.py", "tests/gateway/test_budgets.py"),
    "gateway/model_proxy/estimates.py": (
        "tests/gateway/model_proxy/test_wires.py",
        "tests/gateway/model_proxy/test_request.py",
    ),
    # Integration internals: through the integration, against the real peer.
    "integrations/_framework.py": ("tests/frameworks/test_langchain.py",),
    # The frameworks run on asyncio in virtual time (tests/frameworks/conftest.py), the
    # integrations against real peers in real time: two directories.
    "integrations/adk.py": ("tests/frameworks/test_adk.py",),
    "integrations/claude_agent.py": ("tests/frameworks/test_claude_agent.py",),
    "integrations/langchain.py": ("tests/frameworks/test_langchain.py",),
    "integrations/openai_agents.py": ("tests/frameworks/test_openai_agents.py",),
    "integrations/pydantic_ai.py": ("tests/frameworks/test_pydantic_ai.py",),
    # A test directory named ``mcp`` or ``redis`` would shadow the SDK for the helper
    # servers the tests run as scripts from tests/integrations: these stay flat.
    "integrations/mcp/gate.py": ("tests/integrations/test_mcp_proxy.py",),
    "integrations/mcp/relay.py": (
        "tests/integrations/test_mcp_proxy.py",
        "tests/integrations/test_mcp_hostile.py",
    ),
    "integrations/mcp/serve.py": ("tests/integrations/test_mcp_proxy.py",),
    "integrations/mcp/tools.py": (
        "tests/integrations/test_mcp.py",
        "tests/integrations/test_mcp_tracing.py",
    ),
    "integrations/redis/scripts.py": ("tests/integrations/test_redis_ledger.py",),
    "integrations/redis/store.py": ("tests/integrations/test_redis.py",),
    "gateway/mcp_gateway/downstream.py": ("tests/gateway/mcp_gateway/test_server.py",),
    "gateway/model_proxy/responses.py": ("tests/gateway/model_proxy/test_wires.py",),
    "gateway/model_proxy/upstream.py": ("tests/gateway/model_proxy/test_wires.py",),
    "integrations/otel.py": ("tests/test_otlp_export.py", "tests/integrations/test_phoenix.py"),
    "integrations/temporal/activities.py": ("tests/integrations/temporal/test_corners.py",),
    "integrations/temporal/client.py": ("tests/integrations/temporal/test_guide.py",),
    "integrations/temporal/turn_workflow.py": ("tests/integrations/temporal/test_agent.py",),
    # The core's shared vocabulary: every test reads it; these prove its promises.
    "pipeline/approval.py": ("tests/guards/test_approval.py",),
    "pipeline/contract.py": ("tests/pipeline/test_typing.py", "tests/test_public_api.py"),
    # The package's moved names: observable as importing one from the package.
    "pipeline/_moved.py": ("tests/test_public_api.py",),
    "pipeline/deadline.py": ("tests/wrappers/test_timeout.py",),
    "pipeline/plugin_config.py": ("tests/pipeline/test_harness.py", "tests/cli/test_check.py"),
    # The decisions a pre- or post-execute layer returns: observable as what the registry
    # does with them.
    "pipeline/verdicts.py": ("tests/pipeline/test_registry.py",),
    # The loop's and the log's parts: observable only as a turn and its log.
    "pipeline/loop/paused.py": ("tests/guards/test_approval.py",),
    "pipeline/loop/step_order.py": ("tests/pipeline/loop/test_agent_loop.py",),
    "pipeline/session/events.py": ("tests/pipeline/session/test_log.py",),
    "pipeline/session/messages.py": ("tests/pipeline/session/test_log.py",),
    # The gateway's old import paths (until 0.3): each through the test of the move.
    **{
        f"integrations/{name}.py": ("tests/integrations/test_moved.py",)
        for name in ("budgets", "decision_log", "mcp_gateway", "model_proxy", "spend", "tenants")
    },
    # The telemetry helpers: through the layers that export with them.
}


def _mirror(module: Path) -> Path:
    """``tests/<package>/…/test_<module>.py`` (a private module's leading ``_`` dropped)."""
    relative = module.relative_to(ROOT)
    return ROOT / "tests" / relative.parent / f"test_{relative.stem.lstrip('_')}.py"


def _modules() -> list[Path]:
    return sorted(
        path
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if path.name != "__init__.py" and "__pycache__" not in path.parts
    )


def test_every_module_has_its_tests() -> None:
    """Tests mirror modules: ``tests/<package>/test_<module>.py`` for each, or the test
    files that exercise it named in ``MIRRORED_BY``."""
    untested = [
        str(module.relative_to(ROOT))
        for module in _modules()
        if not _mirror(module).exists() and str(module.relative_to(ROOT)) not in MIRRORED_BY
    ]
    assert untested == []


def test_the_map_of_tests_is_current() -> None:
    modules = {str(module.relative_to(ROOT)): module for module in _modules()}
    for name, tests in MIRRORED_BY.items():
        assert name in modules, f"{name} is gone: drop it from MIRRORED_BY"
        assert not _mirror(modules[name]).exists(), f"{name} has its own test file now"
        for test in tests:
            assert (ROOT / test).is_file(), f"{name}: {test} is gone"


def _gateway_imports() -> dict[str, set[str]]:
    """Each gateway module's imports of other gateway modules — every import statement,
    those under ``TYPE_CHECKING`` and inside functions included."""
    import ast

    root = ROOT / "gateway"
    names: dict[str, Path] = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names["guardstack." + ".".join(parts)] = path
    found: dict[str, set[str]] = {}
    for name, path in names.items():
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                # `from package import module` imports the module
                subs = {f"{node.module}.{a.name}" for a in node.names} & set(names)
                imported.update(subs or {node.module})
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
        found[name] = {m for m in imported if m.startswith("guardstack.gateway") and m != name}
    return found


def test_the_gateway_has_no_import_circle() -> None:
    """One gateway, one request value (#63): no module of ``gateway/`` imports, through
    any chain of imports, one that imports it — a package's ``__init__`` re-exporting
    its own modules aside."""
    graph = _gateway_imports()
    circles = []
    for start in graph:
        stack, seen = [start], set()
        while stack:
            module = stack.pop()
            for target in graph.get(module, ()):
                if target == start and not start.startswith(module):
                    circles.append((start, module))
                if target not in seen and not start.startswith(target):
                    seen.add(target)
                    stack.append(target)
    assert circles == []
