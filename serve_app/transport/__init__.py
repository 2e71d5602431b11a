"""How the gateway reaches model instances without a Ray Serve call per batch (no Ray imports here)."""

from serve_app.transport.channel import ChannelClient, ChannelServer

__all__ = ["ChannelClient", "ChannelServer"]
