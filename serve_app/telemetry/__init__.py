"""OpenTelemetry, in one place: the spans of traced requests and their export (see :mod:`.spans`)."""
