"""Value objects and pure helpers: the lowest layer (imports nothing of deep_sleep above it)."""
