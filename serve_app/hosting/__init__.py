"""Model instances in a process: each on its own thread, reached by instance id.

Triton runs every model instance as a thread of one server process.  A
*host* does the same: a shared host (one per node for CPU instances, one per
GPU for that GPU's instances) holds many instances of many models; a
dedicated replica (autoscaled models, or a model that asks for a process of
its own) holds exactly one.  Gateways and the sequence router address an
instance by its id over the host's one direct channel.  The local server
(``python -m serve_app --local``) holds its instances in one host as well,
with its service in the same process (``in_process.py``).  Pure of Ray: the
Ray replicas (``rayserve/host_replica.py``, ``rayserve/model_replica.py``)
and the local server (``local/service.py``) drive it.
"""

from serve_app.hosting.host import InstanceHost
from serve_app.hosting.in_process import InProcessExecutor
from serve_app.hosting.instance import HostedInstance
from serve_app.hosting.messages import ExecuteOn, InstanceLoad

__all__ = ["ExecuteOn", "HostedInstance", "InProcessExecutor", "InstanceHost", "InstanceLoad"]
