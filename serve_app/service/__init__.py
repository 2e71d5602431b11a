"""The one façade both front ends call (cf. MLServer's DataPlane), and the registry of served models.

Every check lives here or below: model and version resolution, readiness,
request validation, request options.  HTTP and gRPC only decode, call, and
encode.
"""

from serve_app.service.inference_service import InferenceService
from serve_app.service.model_executor import ModelExecutor
from serve_app.service.registry import FailedModel, ModelRegistry, ModelState, ServedModel

__all__ = ["FailedModel", "InferenceService", "ModelExecutor", "ModelRegistry", "ModelState", "ServedModel"]
