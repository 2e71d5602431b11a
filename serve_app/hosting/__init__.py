"""Model instances in a process: each on its own thread, reached by instance id.

Triton runs every model instance as a thread of one server process.  A
*host* does the same: a shared host (one per node for CPU instances, one per
GPU for that GPU's instances) holds many instances of many models; a
dedicated replica (autoscaled models, or a model that asks for a process of
its own) holds exactly one.  Gateways and the sequence router address an
instance by its id over the host's one direct channel.  Pure of Ray: the Ray
replicas (``rayserve/host_replica.py``, ``rayserve/model_replica.py``) drive it.
"""

from serve_app.hosting.host import InstanceHost
from serve_app.hosting.instance import HostedInstance
from serve_app.hosting.messages import ExecuteOn, InstanceLoad

__all__ = ["ExecuteOn", "HostedInstance", "InstanceHost", "InstanceLoad"]
