"""Scheduling decisions in plain code; asyncio and Ray only drive them."""
