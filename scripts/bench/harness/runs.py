"""Interleaved runs and their figures.

The machines are shared and noisy: every configuration runs once per run, in turn, so
that load from outside hits them alike, and a figure is the median of the runs (with
min and max beside it where a table shows the spread)."""
import collections
import statistics
import sys
from typing import NamedTuple


def median(values):
    return statistics.median(values)


class Figures(NamedTuple):
    median: float
    min: float
    max: float
    runs: int


def figures(values):
    values = list(values)
    return Figures(statistics.median(values), min(values), max(values), len(values))


class Samples(collections.defaultdict):
    """Values per configuration, in the order they were measured."""

    def __init__(self):
        super().__init__(list)

    def median(self, key):
        return statistics.median(self[key])

    def figures(self, key):
        return figures(self[key])


def interleaved(runs, configs=(), alternate=False, progress=False):
    """Yields (run index, the configurations in this run's order) for each of `runs` runs.
    With `alternate` the order reverses every other run, so that warm-up and drift favour
    none; with `progress`, "run i/N done" goes to stderr once the caller's body for a run
    has finished."""
    configs = list(configs)
    for i in range(runs):
        yield i, (configs[::-1] if alternate and i % 2 else configs)
        if progress:
            print(f"run {i + 1}/{runs} done", file=sys.stderr, flush=True)
