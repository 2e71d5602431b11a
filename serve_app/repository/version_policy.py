"""Which of a model's versions on disk are served (ModelVersionPolicy)."""

from __future__ import annotations

from collections.abc import Sequence

from serve_app.protos import model_config_pb2 as mc


def select_versions(config: mc.ModelConfig, available: Sequence[int]) -> list[int]:
    """The served versions, ascending.

    No policy means ``latest { num_versions: 1 }``, as in Triton; a latest
    policy with ``num_versions: 0`` also serves one.  A specific policy serves
    only the listed versions that are available; an empty result is for the
    caller to report.
    """
    versions = sorted(set(available))
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice") if config.HasField("version_policy") else None
    if choice == "all":
        return versions
    if choice == "specific":
        wanted = set(policy.specific.versions)
        return [v for v in versions if v in wanted]
    count = max(policy.latest.num_versions, 1) if choice == "latest" else 1
    return versions[-count:]
