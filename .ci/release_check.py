"""The release check CI runs: the artifacts a user would install, checked as a user would.

1. the sdist and the wheel built from a clean tree (the committed files only);
2. their metadata checked (``twine check``); the version is the one ``pyproject.toml``
   names; the wheel carries no tests or benchmark data;
3. the wheel installed with its ``demo`` extra into a fresh environment, run from a
   directory with no checkout in it: ``guardstack --version`` and ``guardstack demo``;
4. every ``guardstack.integrations`` module imported from the built wheel, with the
   third-party packages of the environment that has every extra (this one).

    python .ci/release_check.py WORKDIR
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import time
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INTEGRATIONS = [
    "integrations.anthropic", "integrations.openai", "integrations.litellm",
    "integrations.redis", "integrations.mcp", "integrations.langchain",
    "integrations.openai_agents", "integrations.pydantic_ai", "integrations.temporal",
    "integrations.otel", "integrations.claude_agent", "integrations.adk",
    "gateway.model_proxy", "gateway.mcp_gateway",
]  # fmt: skip


def run(*command: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    started = time.monotonic()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        print(done.stdout[-4000:], done.stderr[-4000:], sep="\n", file=sys.stderr)
        raise SystemExit(f"release check: `{' '.join(command)}` failed ({done.returncode})")
    print(f"  ok ({time.monotonic() - started:.1f} s): {' '.join(command)[:110]}")
    return done.stdout


def main(work: Path) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    clean = work / "clean"
    print(f"release check: guardstack {version}")
    # 1. a clean tree: what git holds, nothing a developer left lying around
    run("git", "worktree", "add", "--detach", str(clean), "HEAD", cwd=ROOT)
    try:
        dist = work / "dist"
        run(sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(clean),
            cwd=work)  # fmt: skip
        [wheel] = dist.glob("*.whl")
        [sdist] = dist.glob("*.tar.gz")
        assert f"guardstack-{version}-" in wheel.name, wheel.name
        # 2. metadata, and what the wheel carries
        run(sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist), cwd=work)
        names = zipfile.ZipFile(wheel).namelist()
        stray = [n for n in names if n.startswith(("tests/", "benchmarks/", "examples/"))]
        assert not stray, f"the wheel carries {stray[:5]}"
        assert not [n for n in names if n.endswith((".jsonl", ".png"))], "data in the wheel"
        # every module of the source folders (subpackages too) is in the wheel
        folders = ("pipeline", "guards", "wrappers", "integrations", "gateway", "cli")
        sources = [
            f"guardstack/{path.relative_to(clean).as_posix()}"
            for folder in folders
            for path in (clean / folder).rglob("*.py")
        ]
        missing = sorted(set(sources) - set(names))
        assert not missing, f"the wheel lacks {missing[:5]} (add the package to pyproject)"
        with tarfile.open(sdist) as archive:
            assert any(n.endswith("/CHANGELOG.md") for n in archive.getnames())
        # 3. a fresh environment, the demo extra, no checkout anywhere near
        fresh = work / "fresh"
        run(sys.executable, "-m", "venv", str(fresh), cwd=work)
        python = str(fresh / "bin" / "python")
        run(python, "-m", "pip", "install", "--quiet", f"{wheel}[demo]", cwd=work)
        away = work / "elsewhere"
        away.mkdir()
        clean_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        said = run(str(fresh / "bin" / "guardstack"), "--version", cwd=away, env=clean_env)
        assert said.strip() == f"guardstack {version}", said
        demo = run(str(fresh / "bin" / "guardstack"), "demo", cwd=away, env=clean_env)
        assert "repeat" in demo.lower(), demo[-500:]
        where = run(python, "-c", "import guardstack.pipeline as p; print(p.__file__)",
                    cwd=away, env=clean_env)  # fmt: skip
        assert str(fresh) in where, where
        assert str(ROOT) not in where, where
        # 4. every integration module from the wheel, with this environment's extras
        target = work / "wheel-only"
        run(sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
            str(target), str(wheel), cwd=work)  # fmt: skip
        code = (
            "import importlib, sys\n"
            f"for name in {INTEGRATIONS!r}:\n"
            "    module = importlib.import_module('guardstack.' + name)\n"
            f"    assert module.__file__.startswith({str(target)!r}), module.__file__\n"
            "print('imported', len(sys.modules))\n"
        )
        import sysconfig

        site = sysconfig.get_paths()["purelib"]
        env = dict(clean_env, PYTHONPATH=os.pathsep.join([str(target), site]))
        # -S: no site processing, so not the editable install's finder (its .pth); the
        # wheel's files first on the path, this environment's packages (every extra) after
        run(sys.executable, "-S", "-c", code, cwd=away, env=env)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(clean)], cwd=ROOT)
    print("release check: passed")


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
