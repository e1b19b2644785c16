"""Real ps_server processes for the Python tests: shards on 127.0.0.1 with
ports the kernel picks (asyncps.cluster, the launcher asyncps.run uses),
killed at the end of each test."""

import os

import pytest

from asyncps.cluster import Shards  # noqa: F401 (optim_test uses it)

SERVER = os.environ.get("ASYNCPS_PS_SERVER", "server/ps_server")


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
