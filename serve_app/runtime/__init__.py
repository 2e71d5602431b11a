"""A loaded model version's instance: signature + backend, executing requests.

Pure of Ray: the Ray model deployment and the local (in-process) host both
drive a :class:`ModelInstance`.
"""

from serve_app.runtime.instance import ModelInstance

__all__ = ["ModelInstance"]
