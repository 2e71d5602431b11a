"""Protocol-neutral inference requests and responses, and their validation."""
