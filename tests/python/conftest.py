"""Real ps_server processes for the Python tests: shards on 127.0.0.1 with
ports the kernel picks (asyncps.cluster, the launcher asyncps.run uses),
killed at the end of each test."""

import os

import pytest

from asyncps.cluster import Shards  # noqa: F401 (optim_test uses it)

SERVER = os.environ.get("ASYNCPS_PS_SERVER", "server/ps_server")


@pytest.fixture
def shards(tmp_path):
    s = Shards(SERVER, ready_dir=str(tmp_path))
    yield s
    s.kill()
