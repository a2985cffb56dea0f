"""Benchmark harnesses: what workwarden costs, measured against a limit in the same run.

Each harness is a module run as `python -m bench.NAME` (`cas`, `procrastinate`,
`growth`, `checker`, `stateful`); `--help` lists its sizes. A harness alternates
the two things it compares, reports medians of its repetitions and their
ratio, writes its figures to `bench/results/NAME.json` and draws
`bench/plots/NAME.png`. `bench/RESULTS.md` records the figures of a run with
the command, the date and the machine. They need the `bench` extra
(`pip install -e ".[bench]"`) for the plots and the Procrastinate comparison.
"""
