"""Benchmarks that print ratios against peers measured in the same run."""
