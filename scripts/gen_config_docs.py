"""Write docs/configuration.md from ServerSettings: every setting, its flag, default and help.

python -m scripts.gen_config_docs          # rewrite the page
python -m scripts.gen_config_docs --check  # exit 1 if the page is stale (tests run this check)
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import MISSING
from typing import Any

from serve_app.cli import flag_name
from serve_app.settings import setting_fields
from tests.support.paths import ROOT

PAGE = ROOT / "docs" / "configuration.md"

HEADER = """# Configuration

Every server setting can be given three ways, with the same name and default:

- as a flag of `python -m serve_app` (the flag column; a boolean is on with `--<flag>` or
  `--<flag>=true`, as Triton writes it, and off with `--no-<flag>` or `--<flag>=false`);
- as a `key=value` argument of `serve run serve_app.app:build_app model_repository=DIR ...`;
- under `args:` of the application in a Serve config file (`configs/serve_app.yaml`).

Lists are repeatable flags, or one string in `serve run` arguments (items separated by `,`, or by `;`
where the table says so).  This page is generated from `serve_app/settings.py` by
`python -m scripts.gen_config_docs`; a test fails when it is stale.

| setting | flag | default | what it does |
| --- | --- | --- | --- |
"""

FOOTER = """
Flags of `python -m serve_app` that are not settings: `--address` (join a running Ray cluster instead
of starting one; `auto` finds a local one), `--num-cpus`, `--dashboard` and `--object-store-memory`
(for a Ray it starts), and `--local` (serve without Ray: every model instance in this process, for
development and tests; no model control, autoscaling or multi-node placement).
`--disable-auto-complete-config` is Triton's other spelling of `--strict-model-config=true`.
"""


def _default(value: Any) -> str:
    if value is MISSING:
        return "(required)"
    if isinstance(value, tuple):
        return "(none)" if not value else ", ".join(value)
    if isinstance(value, bool):
        return "on" if value else "off"
    if value == "":
        return "(none)"
    return f"`{value}`"


def render() -> str:
    rows = []
    for f in setting_fields():
        help_text = str(f.metadata.get("help", "")).replace("|", "\\|")
        if f.metadata.get("sep") == ";":
            help_text += " (`;`-separated in serve run args)"
        if f.metadata.get("path"):
            help_text += "; relative paths are taken from the working directory"
        rows.append(f"| `{f.name}` | `{flag_name(f)}` | {_default(f.default)} | {help_text} |")
    return HEADER + "\n".join(rows) + "\n" + FOOTER


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/configuration.md is stale")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        current = PAGE.read_text() if PAGE.exists() else ""
        if current != text:
            print(f"{PAGE} is stale: run python -m scripts.gen_config_docs", file=sys.stderr)
            return 1
        return 0
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(text)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
