"""Benchmarks that print ratios against peers measured in the same run (layer 5, a tool).

May import every layer below; runs the roles as subprocesses.
"""
