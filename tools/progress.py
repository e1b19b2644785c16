"""Progress and an ETA for the tools' long loops: an experiment grid, a
chaos sweep, a history check or its soak.

    progress = Progress(total=12)             # or Progress(minutes=30)
    for item in items:
        print(f"== {progress.tag()} {item}")  # "[3/12, ~2m05s left]"
        ...
        progress.step()

The ETA is the mean time of the items done so far times the items left
(the items of one loop cost about the same); with `minutes` (a soak that
stops at a time limit) it is never past that limit. Standard library only.
"""

import time


def duration(seconds):
    """4s, 2m05s, 1h02m."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    def __init__(self, total=None, minutes=None, clock=time.monotonic):
        """`total` items (None: unknown), or until `minutes` pass."""
        self.total, self.minutes, self.clock = total, minutes, clock
        self.start = clock()
        self.done = 0

    def step(self):
        """One item finished."""
        self.done += 1

    def left_seconds(self):
        """The ETA in seconds, or None before the first item is done (or
        with neither a total nor a time limit)."""
        elapsed = self.clock() - self.start
        limit = None
        if self.minutes is not None:
            limit = max(0.0, self.minutes * 60 - elapsed)
        if self.done == 0 or self.total is None:
            return limit
        by_count = elapsed / self.done * max(0, self.total - self.done)
        return by_count if limit is None else min(by_count, limit)

    def tag(self):
        """"[k/N, ~ETA left]" for the item about to start (k = done + 1);
        "[k/N]" until an ETA can be told."""
        count = f"{self.done + 1}/{self.total}" if self.total else \
            f"{self.done + 1}"
        left = self.left_seconds()
        if left is None:
            return f"[{count}]"
        return f"[{count}, ~{duration(left)} left]"
