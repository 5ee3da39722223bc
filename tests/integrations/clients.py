"""The real clients people put in front of the gateways, installed from the npm registry
into a cache and driven headless: Claude Code, Codex CLI, Gemini CLI and the MCP
Inspector's CLI. Never patched; each run bounded in time, in a process group of its
own (its shells die with it), against loopback addresses only.

The cache is ``$GUARDSTACK_CLIENTS`` (default ``~/.cache/guardstack-clients``); the
first test that needs it installs the pinned versions there, under a file lock, so
parallel runs install once. A client that cannot be installed fails its test.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

#: The versions the tests were written against (npm's names).
PINNED: Mapping[str, str] = {
    "@anthropic-ai/claude-code": "2.1.197",
    "@openai/codex": "0.171.0",
    "@google/gemini-cli": "0.61.0",
    "@modelcontextprotocol/inspector": "2.12.0",
}
#: The command each package puts in ``node_modules/.bin``.
COMMANDS: Mapping[str, str] = {
    "claude": "@anthropic-ai/claude-code",
    "codex": "@openai/codex",
    "gemini": "@google/gemini-cli",
    "mcp-inspector": "@modelcontextprotocol/inspector",
}


def cache() -> Path:
    configured = os.environ.get("GUARDSTACK_CLIENTS")
    return Path(configured) if configured else Path.home() / ".cache" / "guardstack-clients"


def _installed(folder: Path) -> bool:
    manifest = folder / "package.json"
    if not manifest.exists():
        return False
    try:
        wanted = json.loads(manifest.read_text("utf-8")).get("dependencies", {})
    except ValueError:
        return False
    return all(wanted.get(name) == version for name, version in PINNED.items()) and all(
        (folder / "node_modules" / ".bin" / command).exists() for command in COMMANDS
    )


def install() -> Path:
    """The cache with every pinned client installed (installing them first if needed)."""
    folder = cache()
    folder.mkdir(parents=True, exist_ok=True)
    if _installed(folder):
        return folder
    npm = shutil.which("npm")
    if npm is None:
        raise AssertionError("npm is not on PATH: the real clients cannot be installed")
    with (folder / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _installed(folder):
            (folder / "package.json").write_text(
                json.dumps({"name": "guardstack-clients", "private": True,
                            "dependencies": dict(PINNED)}),
                "utf-8",
            )  # fmt: skip
            done = subprocess.run(
                [npm, "install", "--no-audit", "--no-fund", "--prefix", str(folder)],
                capture_output=True,
                text=True,
                timeout=900,
                check=False,
            )
            if done.returncode != 0 or not _installed(folder):
                raise AssertionError(
                    f"npm install of the real clients failed ({done.returncode}):\n"
                    f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
                )
    return folder


def command(name: str) -> str:
    return str(install() / "node_modules" / ".bin" / name)


@attrs.frozen
class Ran:
    """What a client run left: its exit code, standard output and error."""

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool = False

    def events(self) -> list[dict[str, Any]]:
        """Its standard output's JSON lines (stream-json, ``--json``)."""
        found = []
        for line in self.stdout.splitlines():
            with contextlib.suppress(ValueError):
                value = json.loads(line)
                if isinstance(value, dict):
                    found.append(value)
        return found


def run(
    arguments: Sequence[str],
    *,
    environment: Mapping[str, str],
    cwd: Path,
    timeout_s: float = 120,
    stdin: str = "",
) -> Ran:
    """Run a client to its end (or ``timeout_s``), in its own process group, with a
    clean environment (``PATH`` and ``HOME`` plus ``environment``): no key or setting of
    the machine leaks in."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(cwd),
        "LANG": "C.UTF-8",
        "NO_COLOR": "1",
        "CI": "1",
        **environment,
    }
    process = subprocess.Popen(
        list(arguments),
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(stdin, timeout=timeout_s)
        return Ran(process.returncode, out, err)
    except subprocess.TimeoutExpired:
        _kill(process)
        out, err = process.communicate()
        return Ran(process.returncode, out, err, timed_out=True)
    finally:
        _kill(process)


def _kill(process: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


# -- each client's settings -------------------------------------------------------------


def claude(
    prompt: str,
    *,
    base_url: str,
    key: str,
    home: Path,
    extra: Sequence[str] = (),
    model: str | None = None,
    environment: Mapping[str, str] | None = None,
    timeout_s: float = 120,
) -> Ran:
    """``claude -p PROMPT`` headless against ``base_url`` (docs/model-proxy.md's settings)."""
    config = home / ".claude-config"
    config.mkdir(parents=True, exist_ok=True)
    arguments = [command("claude"), "-p", prompt, "--output-format", "stream-json", "--verbose",
                 "--allowedTools", "Bash", "Read", "Glob", "Grep", *extra]  # fmt: skip
    if model is not None:
        arguments += ["--model", model]
    env = {
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": key,
        "CLAUDE_CONFIG_DIR": str(config),
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_BUG_COMMAND": "1",
        **(environment or {}),
    }
    return run(arguments, environment=env, cwd=home, timeout_s=timeout_s)


def codex(
    prompt: str,
    *,
    base_url: str,
    key: str,
    home: Path,
    headers: Mapping[str, str] | None = None,
    environment: Mapping[str, str] | None = None,
    timeout_s: float = 120,
    mcp: tuple[str, str, str] | None = None,
) -> Ran:
    """``codex exec --json PROMPT`` against ``base_url`` (a ``CODEX_HOME`` of its own);
    ``mcp``: an MCP server over streamable HTTP, ``(name, url, bearer key)``."""
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    header_lines = ""
    env_headers: dict[str, str] = {}
    for number, (name, value) in enumerate((headers or {}).items()):
        variable = f"GUARDSTACK_HEADER_{number}"
        env_headers[variable] = value
        header_lines += f'"{name}" = "{variable}", '
    (codex_home / "config.toml").write_text(
        'model = "gpt-5-codex"\n'
        'model_provider = "guardstack"\n'
        'approval_policy = "never"\n'
        'sandbox_mode = "danger-full-access"\n'
        "[model_providers.guardstack]\n"
        'name = "guardstack"\n'
        f'base_url = "{base_url}/v1"\n'
        'env_key = "GUARDSTACK_CLIENT_KEY"\n'
        'wire_api = "responses"\n'
        + (f"env_http_headers = {{ {header_lines.rstrip(', ')} }}\n" if header_lines else "")
        + (
            f'[mcp_servers.{mcp[0]}]\nurl = "{mcp[1]}"\n'
            'bearer_token_env_var = "GUARDSTACK_MCP_KEY"\n'
            if mcp is not None
            else ""
        ),
        "utf-8",
    )
    if mcp is not None:
        env_headers["GUARDSTACK_MCP_KEY"] = mcp[2]
    env = {"CODEX_HOME": str(codex_home), "GUARDSTACK_CLIENT_KEY": key, **env_headers,
           **(environment or {})}  # fmt: skip
    arguments = [command("codex"), "exec", "--skip-git-repo-check", "--json", prompt]
    return run(arguments, environment=env, cwd=home, timeout_s=timeout_s)


def gemini(
    prompt: str,
    *,
    base_url: str,
    key: str,
    home: Path,
    environment: Mapping[str, str] | None = None,
    timeout_s: float = 120,
) -> Ran:
    """``gemini -p PROMPT --yolo -o json`` against ``base_url``."""
    settings = home / ".gemini"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "settings.json").write_text(
        json.dumps({"security": {"auth": {"selectedType": "gemini-api-key"}}}), "utf-8"
    )
    env = {
        "GOOGLE_GEMINI_BASE_URL": base_url,
        "GEMINI_API_KEY": key,
        "GEMINI_CLI_NO_RELAUNCH": "1",
        "GEMINI_CLI_TRUST_WORKSPACE": "true",
        **(environment or {}),
    }
    arguments = [command("gemini"), "-p", prompt, "--yolo", "-o", "json"]
    return run(arguments, environment=env, cwd=home, timeout_s=timeout_s)


def inspector(url: str, *arguments: str, key: str | None = None, home: Path) -> Ran:
    """``mcp-inspector --cli URL ARGUMENTS`` (one fresh MCP session per command)."""
    headers = ["--header", f"Authorization: Bearer {key}"] if key is not None else []
    return run(
        [command("mcp-inspector"), "--cli", url, *headers, *arguments],
        environment={},
        cwd=home,
        timeout_s=60,
    )


@contextlib.contextmanager
def folder(base: Path, name: str) -> Iterator[Path]:
    """A fresh working folder (the client's HOME and cwd) with a file or two to list."""
    path = base / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "README.md").write_text("# a project\n", "utf-8")
    (path / "main.py").write_text("print('hello')\n", "utf-8")
    yield path
