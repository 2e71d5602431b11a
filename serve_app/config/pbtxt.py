"""Reading config.pbtxt: protobuf text format into our ModelConfig.

Triton parses config.pbtxt with protobuf's text parser, so we do the same and
only reword its errors so that a user sees which model and file are at fault.
"""

from __future__ import annotations

from google.protobuf import text_format

from serve_app.errors import InvalidConfig
from serve_app.protos import model_config_pb2 as mc

# Our schema lives in our own proto package; users know the Triton names.
_PROTO_PACKAGE_PREFIX = mc.DESCRIPTOR.package + "."


def config_error(model: str, path: str, detail: str) -> InvalidConfig:
    """The one wording for every config error: model, file, then what is wrong."""
    return InvalidConfig(f"model '{model}', file '{path}': {detail}")


def parse_config(text: str, *, model: str, path: str) -> mc.ModelConfig:
    """Parse config.pbtxt text; repeated fields given as several blocks merge.

    Unknown fields, bad enum values and syntax errors raise ``InvalidConfig``
    naming the model, the file and the ``line:column`` of the problem.
    """
    config = mc.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        detail = str(exc).replace(_PROTO_PACKAGE_PREFIX, "")
        raise config_error(model, path, detail) from None
    return config
