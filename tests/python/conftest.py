"""Real ps_server processes for the Python tests: shards on 127.0.0.1 with
ports the kernel picks (asyncps.cluster, the launcher asyncps.run uses),
killed at the end of each test."""

import os

import pytest

from asyncps.cluster import Shards  # noqa: F401 (optim_test uses it)

SERVER = os.environ.get("ASYNCPS_PS_SERVER", "server/ps_server")


def pytest_collection_modifyitems(config, items):
    """Under bazel's test sharding (BUILD's shard_count), this shard runs
    every TEST_TOTAL_SHARDS-th test from TEST_SHARD_INDEX on: the slow
    ones sit together in their files, so taking them in turn spreads them
    over the shards."""
    total = int(os.environ.get("TEST_TOTAL_SHARDS", "1"))
    if total <= 1:
        return
    index = int(os.environ["TEST_SHARD_INDEX"])
    status = os.environ.get("TEST_SHARD_STATUS_FILE")
    if status:  # Says bazel that this test knows how to shard.
        open(status, "w").close()
    keep = [item for k, item in enumerate(items) if k % total == index]
    config.hook.pytest_deselected(
        items=[item for k, item in enumerate(items) if k % total != index])
    items[:] = keep


def run_ranks(work, ranks, timeout=120):
    """Runs work(r) for r in range(ranks), each on a thread of its own (bsp
    ranks wait for one another), and fails if one hangs past `timeout`
    seconds or raises (re-raising the first error)."""
    import threading

    errors = []

    def guarded(r):
        try:
            work(r)
        except Exception as e:  # noqa: BLE001 (re-raised below)
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(r,))
               for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), "a rank hangs"
    if errors:
        raise errors[0]


@pytest.fixture
def shards(tmp_path):
    s = Shards(SERVER, ready_dir=str(tmp_path))
    yield s
    s.kill()
