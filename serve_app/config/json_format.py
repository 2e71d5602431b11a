"""ModelConfig as JSON, the way Triton's config endpoint writes and reads it.

Triton prints the protobuf JSON form with proto field names and every field,
defaults included, then turns the 64-bit integers that protobuf writes as
strings back into numbers (``"dims": [16]``, not ``["16"]``).  Map keys stay
strings, as JSON requires.
"""

from __future__ import annotations

import json
from typing import Any, cast

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from serve_app.errors import InvalidConfig
from serve_app.protos import model_config_pb2 as mc

_INT64_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def config_to_json(config: mc.ModelConfig) -> dict[str, Any]:
    """The config as Triton's ``GET v2/models/<m>/config`` returns it."""
    raw = json_format.MessageToDict(
        config,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
        use_integers_for_enums=False,
    )
    # The stubs type a message's DESCRIPTOR as either descriptor class; at run time the C (upb) one
    # is registered as a google.protobuf.descriptor.Descriptor too.
    return _fix_message(cast(Descriptor, mc.ModelConfig.DESCRIPTOR), raw)


def config_from_json(obj: dict[str, Any] | str, *, model: str) -> mc.ModelConfig:
    """A ModelConfig from JSON text or a parsed object (the repository load API's
    ``config`` parameter); numbers or strings are accepted for 64-bit fields."""
    try:
        data = json.loads(obj) if isinstance(obj, str) else obj
    except json.JSONDecodeError as exc:
        raise InvalidConfig(f"model '{model}': config is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidConfig(f"model '{model}': config JSON must be an object, got {type(data).__name__}")
    config = mc.ModelConfig()
    try:
        json_format.ParseDict(data, config)
    except json_format.ParseError as exc:
        detail = str(exc).replace(mc.DESCRIPTOR.package + ".", "")
        raise InvalidConfig(f"model '{model}': invalid config JSON: {detail}") from None
    return config


def _fix_message(descriptor: Descriptor, value: dict[str, Any]) -> dict[str, Any]:
    """Fields in declaration order, 64-bit integers as numbers."""
    out: dict[str, Any] = {}
    for field in descriptor.fields:
        if field.name in value:
            out[field.name] = _fix_field(field, value[field.name])
    return out


def _fix_field(field: FieldDescriptor, value: Any) -> Any:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        value_field = field.message_type.fields_by_name["value"]
        return {key: _fix_scalar(value_field, item) for key, item in value.items()}
    if field.is_repeated:
        return [_fix_scalar(field, item) for item in value]
    return _fix_scalar(field, value)


def _fix_scalar(field: FieldDescriptor, value: Any) -> Any:
    if field.message_type is not None:
        return _fix_message(field.message_type, value)
    if field.type in _INT64_TYPES:
        return int(value)
    return value
