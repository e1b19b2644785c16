#!/usr/bin/python3
"""tools/progress.py: the place and ETA the tools' long loops print, on a
clock the test moves: none before the first item, the mean time of the
items done times those left after it, a soak's time limit as a bound, and
durations in s, m and h."""
import os
import sys

sys.path.insert(0, os.path.join(os.environ["TEST_SRCDIR"],
                                os.environ["TEST_WORKSPACE"]))
from tools.progress import Progress, duration  # noqa: E402

failures = []


def expect(got, want, what):
    if got != want:
        failures.append(f"{what}: got {got!r}, want {want!r}")


now = [100.0]
p = Progress(total=4, clock=lambda: now[0])
expect(p.tag(), "[1/4]", "no ETA before an item is done")
now[0] += 30
p.step()
expect(p.tag(), "[2/4, ~1m30s left]", "30 s an item, 3 left")
now[0] += 90
p.step()
p.step()
expect(p.left_seconds(), 40.0, "120 s for 3 items, 1 left")
p.step()
expect(p.tag(), "[5/4, ~0s left]", "past the total")

now = [0.0]
soak = Progress(total=100, minutes=2, clock=lambda: now[0])
expect(soak.tag(), "[1/100, ~2m00s left]", "a soak's limit before any run")
now[0] += 10
soak.step()
expect(soak.left_seconds(), 110.0, "the limit bounds the count's ETA")
unknown = Progress(clock=lambda: 5.0)
unknown.step()
expect(unknown.tag(), "[2]", "no total, no limit: the count alone")

expect(duration(4.4), "4s", "seconds")
expect(duration(125), "2m05s", "minutes")
expect(duration(3720), "1h02m", "hours")

for f in failures:
    print("FAIL:", f)
print(f"{len(failures)} failed")
sys.exit(1 if failures else 0)
