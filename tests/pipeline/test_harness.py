"""Assembly: plugins in scopes, in order; configuration that fails loud at load."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import pytest

from guardstack.guards import RepeatToolReminder, ToolCallTimeoutPolicy
from guardstack.pipeline import AgentLoop, ConfigError, Harness, Scope, ToolDefinition, ToolRegistry
from guardstack.pipeline.harness import resolve_plugin
from guardstack.pipeline.testing import RecordingLayer, ScriptedTool
from guardstack.wrappers import Retry, Timeout
from tests.helpers import call

EXAMPLES = Path(__file__).parents[2] / "examples"


class TwoLayers:
    name = "two-layers"

    def __init__(self, log: list[tuple[str, str]], tag: str) -> None:
        self.log, self.tag = log, tag

    def apply(self, scope: Scope) -> None:
        scope.use(scope.tools.pre_execute, RecordingLayer(f"{self.tag}-pre", self.log))
        scope.use(scope.tools.dispatch, RecordingLayer(f"{self.tag}-dispatch", self.log))


async def test_plugin_order_is_onion_order_and_dispose_removes_all_it_registered() -> None:
    log: list[tuple[str, str]] = []
    harness = Harness()
    ScriptedTool("t").register(harness.tools)
    outer = harness.plugin(TwoLayers(log, "outer"))
    harness.plugin(TwoLayers(log, "inner"))
    await harness.tools.execute(call("t"))
    assert [name for event, name in log if event == "enter"] == [
        "outer-pre",
        "inner-pre",
        "outer-dispatch",
        "inner-dispatch",
    ]
    outer.dispose()
    outer.dispose()
    assert [handle.id for handle in harness.plugins] == ["two-layers"]
    assert len(harness.tools.pre_execute) == len(harness.tools.dispatch) == 1
    log.clear()
    await harness.tools.execute(call("t"))
    assert [name for event, name in log if event == "enter"] == ["inner-pre", "inner-dispatch"]


def test_a_plugin_whose_apply_fails_leaves_nothing_behind() -> None:
    class HalfBroken:
        def apply(self, scope: Scope) -> None:
            scope.use(scope.tools.dispatch, RecordingLayer("registered-first"))
            raise ConfigError("half-broken: cannot finish")

    harness = Harness()
    with pytest.raises(ConfigError, match="cannot finish"):
        harness.plugin(HalfBroken())
    assert len(harness.tools.dispatch) == 0
    assert harness.plugins == []


def test_something_without_apply_is_not_a_plugin() -> None:
    with pytest.raises(TypeError, match="no apply"):
        Harness().plugin(object())  # type: ignore[arg-type]


def test_the_seeds_yaml_loads_unchanged() -> None:
    harness = Harness()
    handles = harness.load(EXAMPLES / "seed.yaml")
    assert [handle.id for handle in handles] == ["timeout-policy", "repeat-tool-reminder"]
    assert isinstance(handles[0].plugin, ToolCallTimeoutPolicy)
    assert handles[1].plugin == RepeatToolReminder(
        thresholds=(3, 5, 8), include=(), exclude=("todo_write",), arguments_preview_chars=500
    )
    assert harness.describe().splitlines()[0] == "plugins: timeout-policy, repeat-tool-reminder"


def test_the_richer_examples_load_in_list_order() -> None:
    harness = Harness()
    harness.load(EXAMPLES / "ordered-stack.yaml")
    dispatch = [
        line.split(". ")[1].split(":")[0] for line in harness.tools.dispatch.describe().splitlines()
    ]
    assert dispatch == ["metrics", "timeout", "retry", "tool-call-timeout-policy"]
    toml = Harness()
    handles = toml.load(EXAMPLES / "ordered-stack.toml")
    assert handles[0].plugin == Timeout(ms=30000, code="TOTAL_TIMEOUT")
    assert handles[1].plugin == Retry(attempts=3, retry_on=["TOOL_TIMEOUT"], backoff_ms=200)


def test_json_files_entry_lists_and_plugins_mappings_all_load(tmp_path: Path) -> None:
    entries = [{"id": "t", "name": "timeout", "config": {"ms": 50}}]
    path = tmp_path / "stack.json"
    path.write_text(json.dumps({"plugins": entries}), encoding="utf-8")
    for source in (path, entries, {"plugins": entries}):
        handles = Harness().load(source)
        assert handles[0].plugin == Timeout(ms=50)


def test_snake_case_and_camel_case_keys_mean_the_same() -> None:
    camel, snake = Harness(), Harness()
    camel.load([{"name": "repeat-tool-reminder", "config": {"argumentsPreviewChars": 9}}])
    snake.load([{"name": "repeat-tool-reminder", "config": {"arguments_preview_chars": 9}}])
    assert camel.plugins[0].plugin == snake.plugins[0].plugin
    assert camel.plugins[0].id == "repeat-tool-reminder"  # the id defaults to the name


def test_a_module_attribute_path_resolves() -> None:
    harness = Harness()
    entry = {"id": "x", "name": "guardstack.wrappers.timeout:Timeout", "config": {"ms": 5}}
    harness.load([entry], allow_imports=True)
    assert harness.plugins[0].plugin == Timeout(ms=5)


@pytest.mark.parametrize(
    "name",
    [
        "timeout",
        "retry",
        "metrics",
        "tracing",
        "tool-call-timeout-policy",
        "repeat-tool-reminder",
        "tool-call-limit",
        "agent-limit",
        "@deepseek-ai/dsh-tool-call-timeout-policy",
        "@deepseek-ai/dsh-repeat-tool-reminder",
    ],
)
def test_every_documented_name_is_an_entry_point(name: str) -> None:
    assert callable(resolve_plugin(name))


@pytest.mark.parametrize(
    ("entries", "fragments"),
    [
        ([{"id": "mine", "name": "no-such-plugin"}], ["'mine'", "no-such-plugin", "known names"]),
        ([{"id": "mine", "name": "nowhere.module:Thing"}], ["'mine'", "nowhere.module:Thing"]),
        (
            [{"id": "rtr", "name": "repeat-tool-reminder", "config": {"treshold": [3]}}],
            ["'rtr'", "unknown config key 'treshold'", "[3]", "known keys"],
        ),
        (
            [{"id": "rtr", "name": "repeat-tool-reminder", "config": {"thresholds": [1, 3]}}],
            ["'rtr'", "'thresholds'", "[1, 3]", "invalid threshold 1"],
        ),
        (
            [{"id": "rtr", "name": "repeat-tool-reminder", "config": {"argumentsPreviewChars": 0}}],
            ["'rtr'", "'argumentsPreviewChars' = 0", "invalid arguments_preview_chars 0"],
        ),
        ([{"id": "t", "name": "timeout", "config": {"ms": -5}}], ["'t'", "'ms' = -5"]),
        ([{"id": "r", "name": "retry", "config": {"attempts": 0}}], ["'r'", "'attempts' = 0"]),
        (
            [{"id": "r", "name": "retry", "config": {"backoffMs": 1, "backoff_ms": 2}}],
            ["'r'", "given twice"],
        ),
        ([{"id": "x", "name": "timeout", "settings": {}}], ["'x'", "unknown entry key 'settings'"]),
        ([{"id": "x"}], ["'x'", "`name` must be a non-empty string"]),
        ([{"id": "x", "name": "timeout", "config": [1]}], ["'x'", "`config` must be a mapping"]),
        (["timeout"], ["entry 1 is not a mapping"]),
        ({"plugin": []}, ["`plugins` list"]),
    ],
)
def test_bad_configuration_raises_at_load_naming_plugin_key_and_value(
    entries: Any, fragments: list[str]
) -> None:
    with pytest.raises(ConfigError) as raised:
        Harness().load(entries)
    for fragment in fragments:
        assert fragment in str(raised.value)


def test_a_failed_load_keeps_nothing_of_that_load() -> None:
    harness = Harness()
    harness.load([{"id": "kept", "name": "timeout", "config": {"ms": 10}}])
    with pytest.raises(ConfigError, match="'broken'"):
        harness.load(
            [
                {"id": "fine", "name": "tool-call-timeout-policy"},
                {"id": "broken", "name": "timeout", "config": {"ms": 0}},
            ]
        )
    assert [handle.id for handle in harness.plugins] == ["kept"]
    assert len(harness.tools.dispatch) == 1


def test_unreadable_and_unparseable_files_are_config_errors(tmp_path: Path) -> None:
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("- id: [unclosed", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad\.yaml: not valid YAML"):
        Harness().load(bad_yaml)
    with pytest.raises(ConfigError, match="cannot read"):
        Harness().load(tmp_path / "missing.yaml")
    other = tmp_path / "stack.ini"
    other.write_text("", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"unknown configuration format '\.ini'"):
        Harness().load(other)
    empty = tmp_path / "empty.yaml"
    empty.write_text("", encoding="utf-8")
    assert Harness().load(empty) == []


def test_a_config_error_names_the_plugin_by_id_and_only_once() -> None:
    with pytest.raises(ConfigError) as raised:
        Harness().load([{"id": "my-retry", "name": "retry", "config": {"attempts": 0}}])
    error = raised.value
    assert error.plugin == "my-retry"
    assert error.key == "attempts"
    assert error.value == 0
    assert str(error) == (
        "plugin 'my-retry' (retry): config key 'attempts' = 0: must be an integer >= 1"
    )


def test_a_config_file_cannot_run_a_callable_it_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "evil.yaml"
    config.write_text(
        "- id: x\n  name: 'os:system'\n  config: {command: 'touch pwned'}\n", encoding="utf-8"
    )
    with pytest.raises(ConfigError, match=r"module path.*--allow-imports"):
        Harness().load(config)
    with pytest.raises(ConfigError, match="is not a plugin class"):
        Harness().load(config, allow_imports=True)
    assert not (tmp_path / "pwned").exists()


def test_a_rejected_module_path_is_never_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "side_effect_module.py").write_text(
        "import pathlib\npathlib.Path('imported').touch()\n", encoding="utf-8"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError):
        Harness().load([{"id": "x", "name": "side_effect_module:Thing"}])
    assert not (tmp_path / "imported").exists()


def test_with_imports_allowed_the_target_must_be_a_plugin_class() -> None:
    with pytest.raises(ConfigError, match=r"'x'.*is not a plugin class") as raised:
        Harness().load([{"id": "x", "name": "collections:OrderedDict"}], allow_imports=True)
    assert raised.value.plugin == "x"


def test_a_yaml_alias_bomb_is_refused_with_a_short_message(tmp_path: Path) -> None:
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for level in range(1, 9):
        levels.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 10) + "]")
    bomb = "\n".join(levels) + "\nplugins:\n  - id: x\n    name: timeout\n    config: {ms: *a8}\n"
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb, encoding="utf-8")
    assert len(bomb) < 1000
    with pytest.raises(ConfigError) as raised:
        Harness().load(path)
    assert len(str(raised.value)) < 500


@pytest.mark.parametrize("config", [[], 0, "", False])
def test_a_config_that_is_not_a_mapping_is_refused_even_when_falsy(config: Any) -> None:
    with pytest.raises(ConfigError, match="'x' \\(timeout\\): `config` must be a mapping"):
        Harness().load([{"id": "x", "name": "timeout", "config": config}])


def test_a_wrong_typed_provider_is_a_config_error_with_nothing_applied() -> None:
    harness = Harness()
    entries = [
        {"id": "kept", "name": "timeout", "config": {"ms": 10}},
        {"id": "t", "name": "tracing", "config": {"tracerProvider": 1}},
    ]
    with pytest.raises(ConfigError) as raised:
        harness.load(entries)
    assert raised.value.plugin == "t"
    assert "'tracerProvider' = 1" in str(raised.value)
    assert harness.plugins == []


def test_long_values_are_cut_in_messages() -> None:
    with pytest.raises(ConfigError) as raised:
        Harness().load([{"id": "x", "name": "retry", "config": {"attempts": "y" * 100_000}}])
    assert len(str(raised.value)) < 400


async def _answer(arguments: Any, call: Any) -> str:
    return "ok"


def test_a_harness_its_registry_and_loop_leave_no_cyclic_garbage() -> None:
    """Built and dropped, they are freed at once by reference counting: none of them
    holds a bound method of its own (a cycle the garbage collector must find)."""
    gc.collect()
    gc.disable()
    try:
        for _ in range(3):
            harness = Harness()
            harness.tools.register(ToolDefinition("t", _answer, timeout_ms=100))
            AgentLoop(ToolRegistry(), None)
            del harness
        assert gc.collect() == 0
    finally:
        gc.enable()
