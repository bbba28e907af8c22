"""Example consumer apps: `counts` (per-key totals) and `join` (stream-stream join)."""
