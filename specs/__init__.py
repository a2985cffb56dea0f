"""The shipped spec files (`workload.toml`), installed as package data."""
