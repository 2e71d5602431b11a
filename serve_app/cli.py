"""`python -m serve_app`: start (or join) Ray, deploy a model repository, serve until signalled.

Every server setting is a flag generated from :class:`ServerSettings` (its
field name with dashes, or Triton's own flag name); the few flags below it
are about the Ray this command starts, or about serving without Ray
(``--local``).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import MISSING, Field
from typing import Any

from serve_app.errors import ServeError
from serve_app.settings import ServerSettings, parse_bool, setting_fields


class TritonBool(argparse.Action):
    """A boolean flag as Triton spells it, ``--name=true|false`` (also ``1|0``, ``on|off``, ``yes|no``), and
    as argparse does, ``--name`` / ``--no-name``."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        negated = ["--no-" + o[2:] for o in option_strings if o.startswith("--")]
        super().__init__([*option_strings, *negated], dest, nargs="?", metavar="true|false", **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if option_string is not None and option_string.startswith("--no-"):
            if values is not None:
                parser.error(f"argument {option_string}: takes no value")
            setattr(namespace, self.dest, False)
            return
        if values is None:
            setattr(namespace, self.dest, True)
            return
        try:
            setattr(namespace, self.dest, parse_bool(values))
        except ValueError:
            parser.error(f"argument {option_string}: invalid boolean value '{values}' (true or false)")


def flag_name(f: Field[Any]) -> str:
    return str(f.metadata.get("flag") or "--" + f.name.replace("_", "-"))


def add_setting_flags(p: argparse.ArgumentParser) -> None:
    """One flag per server setting, with the setting's help and default."""
    for f in setting_fields():
        meta = f.metadata
        kwargs: dict[str, Any] = {"dest": f.name, "help": meta.get("help", "")}
        if f.default is MISSING:
            kwargs["required"] = True
        else:
            kwargs["default"] = list(f.default) if isinstance(f.default, tuple) else f.default
            if not isinstance(f.default, (bool, tuple)) and f.default != "":
                kwargs["help"] += f" (default {f.default})"
        if f.type in ("bool", bool):
            kwargs["action"] = TritonBool
        elif meta.get("repeat"):
            kwargs["action"] = "append"
        elif f.type in ("int", int):
            kwargs["type"] = int
        elif f.type in ("float", float):
            kwargs["type"] = float
        for key in ("choices", "metavar"):
            if key in meta:
                kwargs[key] = meta[key]
        p.add_argument(flag_name(f), **kwargs)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m serve_app", description="Serve a Triton model repository on Ray Serve.")
    add_setting_flags(p)
    p.add_argument(
        "--disable-auto-complete-config",
        dest="strict_model_config",
        action="store_const",
        const=True,
        help="Triton's spelling of --strict-model-config=true",
    )
    ray = p.add_argument_group("the Ray this command starts or joins")
    ray.add_argument(
        "--address", default=None, help="join this Ray cluster instead of starting one ('auto' finds a local one)"
    )
    ray.add_argument(
        "--num-cpus",
        type=int,
        default=None,
        help="logical CPUs of a Ray started here (default: max(cores, 16); instances share the cores like Triton's)",
    )
    ray.add_argument("--dashboard", action="store_true", help="start Ray's dashboard with a Ray started here")
    ray.add_argument("--object-store-memory", type=int, default=None, help="object store bytes of a Ray started here")
    p.add_argument(
        "--local",
        action="store_true",
        help="serve without Ray: every model instance in this process (development and tests; no model control, "
        "autoscaling or multi-node placement)",
    )
    return p


def settings_from(ns: argparse.Namespace) -> ServerSettings:
    values: dict[str, Any] = {}
    for f in setting_fields():
        value = getattr(ns, f.name)
        if isinstance(value, list):
            value = tuple(value)
        if f.metadata.get("path") and value:
            value = os.path.abspath(value)
        values[f.name] = value
    return ServerSettings(**values)


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        settings = settings_from(ns)
        tls = settings.tls()
        if tls is not None:
            tls.check()
    except ServeError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    if not os.path.isdir(settings.model_repository):
        print(f"error: model repository '{settings.model_repository}' is not a directory", file=sys.stderr)
        return 2
    if ns.local or ns.address is None:  # every server of this process, or of the Ray it starts, binds here
        from serve_app.front_ends import check_ports_free

        try:
            check_ports_free(settings)
        except OSError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if ns.local:
        from serve_app.local.server import serve_locally

        return serve_locally(settings)
    from serve_app.rayserve.console import prepare_environment

    prepare_environment(settings, starts_ray=ns.address is None)  # before Ray is imported
    from serve_app.rayserve.runner import RayOptions, serve_on_ray

    ray = RayOptions(ns.address, ns.num_cpus, ns.dashboard, ns.object_store_memory)
    return serve_on_ray(settings, ray)
