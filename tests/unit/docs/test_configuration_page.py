"""docs/configuration.md is generated from ServerSettings: it must not drift from the code."""

from __future__ import annotations

from scripts import gen_config_docs
from serve_app.cli import build_parser
from serve_app.settings import setting_fields


def test_configuration_page_is_current() -> None:
    assert gen_config_docs.PAGE.read_text() == gen_config_docs.render(), (
        "docs/configuration.md is stale: run python -m scripts.gen_config_docs"
    )


def test_every_setting_is_a_flag_with_its_default() -> None:
    parser = build_parser()
    ns = parser.parse_args(["--model-repository", "/m"])
    for f in setting_fields():
        if f.name != "model_repository":
            expected = list(f.default) if isinstance(f.default, tuple) else f.default
            assert getattr(ns, f.name) == expected, f.name
