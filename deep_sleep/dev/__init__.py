"""Development helpers: the synthetic store generator and bulk loader (demo, tests, benchmarks)."""
