"""Fuzz targets, each with a seed corpus in ``tests/fuzz/corpus/<target>/`` that runs as
ordinary tests: every seed, then generated and mutated inputs (hypothesis). A seed is a
case that once mattered — add one whenever a fuzz run finds a failure.

* **config** — ``Harness.load``: loads, or raises ``ConfigError`` naming the file and
  the entry; never another exception, and never runs code (a YAML tag, an import path
  without ``allow_imports``).
* **session** — ``Session.load``: loads (a cut last line is warned about, and the rest
  kept), or raises ``SessionCorruptError``; a log that loads rebuilds its request.
* **proxy_request** — the model proxy's request parsers: a body is accepted or is
  ``Malformed`` (a 400), for each of the three APIs.
* **proxy_stream** — the stream relay: any upstream bytes relay unchanged and never
  raise.
"""

from __future__ import annotations

import random
import warnings
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guardstack.gateway.model_proxy.responses import RESPONSES
from guardstack.gateway.model_proxy.wires import ANTHROPIC, OPENAI, Malformed, parse
from guardstack.pipeline import ConfigError, Harness, Session, SessionCorruptError
from guardstack.pipeline.errors import SessionTailWarning
from tests.gateway.model_proxy.test_wires import relay, split

CORPUS = Path(__file__).parent / "corpus"


def seeds(target: str) -> list[Path]:
    found = sorted((CORPUS / target).iterdir())
    assert found, f"no seeds for {target}"
    return found


def mutated(data: bytes, seed: int) -> bytes:
    """``data`` with a few bytes flipped, cut, or repeated (a deterministic mutation)."""
    rng = random.Random(seed)
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if not out:
            break
        kind, at = rng.randrange(3), rng.randrange(len(out))
        if kind == 0:
            out[at] = rng.randrange(256)
        elif kind == 1:
            del out[at : at + rng.randint(1, 8)]
        else:
            out[at:at] = out[at : at + rng.randint(1, 8)]
    return bytes(out)


# -- config -------------------------------------------------------------------------------


def load_config(path: Path) -> None:
    try:
        Harness().load(path)
    except ConfigError as error:
        says_where = str(path.name) in str(error) or error.plugin or error.key
        if not says_where:
            raise AssertionError(f"{error} names neither the file, a plugin nor a key") from error


@pytest.mark.parametrize("path", seeds("config"), ids=lambda path: path.name)
def test_config_seed(path: Path) -> None:
    load_config(path)


def test_a_config_file_never_runs_code(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    code = f'!!python/object/apply:os.system ["touch {marker}"]'
    config = tmp_path / "evil.yaml"
    config.write_text(f"- name: retry\n  config: {{attempts: {code}}}\n")
    with pytest.raises(ConfigError):
        Harness().load(config)
    assert not marker.exists()
    with pytest.raises(ConfigError, match="allow_imports"):
        Harness().load(CORPUS / "config" / "import-path.yaml")


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32), which=st.integers(0, 100))
def test_config_mutated(tmp_path_factory: pytest.TempPathFactory, seed: int, which: int) -> None:
    source = seeds("config")[which % len(seeds("config"))]
    path = tmp_path_factory.mktemp("config") / source.name
    path.write_bytes(mutated(source.read_bytes(), seed))
    load_config(path)


# -- session -------------------------------------------------------------------------------


def load_session(path: Path) -> None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SessionTailWarning)
            session = Session.load(path)
    except SessionCorruptError:
        return
    session.messages()  # a log that loads rebuilds its request


@pytest.mark.parametrize("path", seeds("session"), ids=lambda path: path.name)
def test_session_seed(path: Path) -> None:
    load_session(path)


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32), which=st.integers(0, 100))
def test_session_mutated(tmp_path_factory: pytest.TempPathFactory, seed: int, which: int) -> None:
    source = seeds("session")[which % len(seeds("session"))]
    path = tmp_path_factory.mktemp("session") / "s.jsonl"
    path.write_bytes(mutated(source.read_bytes(), seed))
    load_session(path)


# -- the proxy's request parsers ----------------------------------------------------------


def parse_request(body: bytes) -> None:
    for wire in (OPENAI, ANTHROPIC, RESPONSES):
        try:
            wire.check(parse(body))
        except Malformed:
            continue
        data = parse(body)
        list(wire.calls(wire.messages(data)))  # a body that is accepted is read in full
        wire.prompts(wire.messages(data))


@pytest.mark.parametrize("path", seeds("proxy_request"), ids=lambda path: path.name)
def test_proxy_request_seed(path: Path) -> None:
    parse_request(path.read_bytes())


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32), which=st.integers(0, 100))
def test_proxy_request_mutated(seed: int, which: int) -> None:
    source = seeds("proxy_request")[which % len(seeds("proxy_request"))]
    parse_request(mutated(source.read_bytes()[:5000], seed))


# -- the proxy's stream relay -------------------------------------------------------------


@pytest.mark.parametrize("path", seeds("proxy_stream"), ids=lambda path: path.name)
def test_proxy_stream_seed(path: Path) -> None:
    data = path.read_bytes()
    for wire in (OPENAI, ANTHROPIC, RESPONSES):
        got, _ = anyio.run(relay, wire, split(data, [7, 19]), False)
        assert got == data


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32), which=st.integers(0, 100), cuts=st.lists(st.integers()))
def test_proxy_stream_mutated(seed: int, which: int, cuts: list[int]) -> None:
    source = seeds("proxy_stream")[which % len(seeds("proxy_stream"))]
    data = mutated(source.read_bytes(), seed)
    got, _ = anyio.run(relay, OPENAI, split(data, cuts), False)
    assert got == data
