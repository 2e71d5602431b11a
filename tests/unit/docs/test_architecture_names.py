"""docs/architecture.md names modules and packages; each one it names must exist, so the page cannot drift
from the code unnoticed.  A name in backticks that looks like a path (``hosting/instance.py``,
``scheduling/``) is looked up under serve_app/ (a bare file name anywhere in it), a dotted
``serve_app.x.y`` as a module or package, and a ``CamelCase`` name as a class (or a method, such as a gRPC
handler) defined in serve_app."""

from __future__ import annotations

import ast
import re

from tests.support.paths import ROOT

PAGE = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "serve_app"
# Named on the page as what is *not* used or as a generated package elsewhere, not as one of ours.
NOT_OURS: set[str] = set()

_TICKED = re.compile(r"`([^`\s]+)`")


def _names() -> set[str]:
    return set(_TICKED.findall(PAGE.read_text()))


def _exists(path: str) -> bool:
    if path.split("/")[0] in {"tests", "scripts", "docs", "deploy"}:
        return (ROOT / path).exists()
    path = path.removeprefix("serve_app/")
    if not path:
        return True
    if "/" in path.rstrip("/"):
        return (PACKAGE / path).exists()
    if path.endswith("/"):
        return any(p.is_dir() for p in PACKAGE.rglob(path.rstrip("/")))
    return any(PACKAGE.rglob(path))


def _definitions() -> set[str]:
    """Every class, function and method name defined in serve_app."""
    found: set[str] = set()
    for source in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                found.add(node.name)
    return found


def test_every_module_and_package_the_page_names_exists() -> None:
    missing = []
    for name in sorted(_names()):
        if name in NOT_OURS:
            continue
        if name.endswith((".py", "/")):
            if not _exists(name):
                missing.append(name)
        elif re.fullmatch(r"serve_app(\.[a-z_0-9]+)+", name):
            relative = name.split(".")[1:]
            module = PACKAGE.joinpath(*relative)
            if not (module.with_suffix(".py").exists() or (module / "__init__.py").exists()):
                missing.append(name)
    assert not missing, f"docs/architecture.md names what no longer exists: {missing}"


def test_every_class_the_page_names_exists() -> None:
    named = {n for n in _names() if re.fullmatch(r"[A-Z][a-z]+(?:[A-Z][a-z0-9]*)+", n)}
    missing = sorted(named - _definitions())
    assert not missing, f"docs/architecture.md names classes that no longer exist: {missing}"
