"""scripts/install.sh against a stand-in python3: it makes its own virtualenv and installs into it (never into the
Python on the PATH), PyTorch's CPU build first when the extras need torch."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from tests.support.paths import ROOT

FAKE_PYTHON3 = """#!/usr/bin/env bash
# `python3 -m venv DIR` makes DIR/bin/python, which records what it is asked to do
if [[ "$1 $2" == "-m venv" ]]; then
    mkdir -p "$3/bin"
    printf '#!/usr/bin/env bash\\necho "$*" >> "%s"\\n' "$LOG" > "$3/bin/python"
    chmod +x "$3/bin/python"
    echo "venv $3" >> "$LOG"
    exit 0
fi
echo "system python3 $*" >> "$LOG"
exit 1
"""


def run_install(tmp_path: Path, *extras: str, index: str | None = "file:///cpu-wheels") -> list[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(FAKE_PYTHON3)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "LOG": str(log), "VENV": str(tmp_path / "venv")}
    env.pop("TORCH_INDEX_URL", None)
    if index is not None:
        env["TORCH_INDEX_URL"] = index
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "install.sh"), *extras], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return log.read_text().splitlines()


def test_the_test_extra_gets_the_cpu_build_of_torch_first(tmp_path: Path) -> None:
    venv, torch, package = run_install(tmp_path, "test")
    assert venv == f"venv {tmp_path / 'venv'}"
    assert torch.startswith("-m pip install ")
    assert torch.endswith("--no-deps --index-url file:///cpu-wheels torch==2.13.0")
    assert package.startswith("-m pip install ") and package.endswith("-e .[test]")


def test_an_empty_index_leaves_torch_to_pips_own_indexes(tmp_path: Path) -> None:
    _, torch, _ = run_install(tmp_path, "test", index="")
    assert "--index-url" not in torch and torch.endswith("torch==2.13.0")


@pytest.mark.parametrize("extras", [(), ("examples",)])
def test_without_torch_only_the_package_is_installed(tmp_path: Path, extras: tuple[str, ...]) -> None:
    lines = run_install(tmp_path, *extras)
    assert len(lines) == 2 and lines[1].endswith("-e ." + (f"[{','.join(extras)}]" if extras else ""))


def test_the_scripts_torch_is_the_one_pyproject_pins() -> None:
    pinned = set(re.findall(r'"torch==([^"]+)"', (ROOT / "pyproject.toml").read_text()))
    (script,) = re.findall(r"^TORCH_VERSION=(\S+)", (ROOT / "scripts" / "install.sh").read_text(), re.M)
    assert pinned == {script}


def test_ci_runs_the_readmes_test_command() -> None:
    assert "bash scripts/check.sh" in (ROOT / "README.md").read_text()
    assert "scripts/check.sh" in (ROOT / ".ci" / "run").read_text()
