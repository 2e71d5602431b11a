"""The one façade both front ends call (cf. MLServer's DataPlane).

Every check lives here or below: model and version resolution, readiness,
request validation.  HTTP and gRPC only decode, call, and encode.
"""

from serve_app.service.catalog import ModelCatalog, ModelState, ModelVersionEntry
from serve_app.service.inference_service import InferenceService, ModelExecutor

__all__ = ["InferenceService", "ModelCatalog", "ModelExecutor", "ModelState", "ModelVersionEntry"]
