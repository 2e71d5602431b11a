"""Per-model statistics (Triton's statistics extension) and their Prometheus view."""

from serve_app.stats.model_stats import FAILURE_REASONS, Duration, ModelStats

__all__ = ["FAILURE_REASONS", "Duration", "ModelStats"]
