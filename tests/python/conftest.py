"""Real ps_server processes for the Python tests: shards on 127.0.0.1 with
ports the kernel picks, killed at the end of each test."""

import os
import re
import signal
import subprocess
import threading

import pytest

SERVER = os.environ.get("ASYNCPS_PS_SERVER", "server/ps_server")
SERVING = re.compile(r"serving asyncps\.v1\.ParameterServer on [^ ]*:(\d+)")


class Shards:
    def __init__(self):
        self.procs = []
        self.servers = []

    def start(self, n, *flags):
        for shard in range(n):
            proc = subprocess.Popen(
                [SERVER, "--host=127.0.0.1", "--port=0", "--data_port=0",
                 f"--shard={shard}", f"--num_shards={n}", *flags],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            self.procs.append(proc)
            # Its log says where it serves (no sleep: the line is the signal).
            for line in proc.stderr:
                match = SERVING.search(line)
                if match:
                    self.servers.append(f"127.0.0.1:{match.group(1)}")
                    break
            else:
                raise RuntimeError(f"shard {shard} exited: {proc.wait()}")
            # Keep draining its log so it never blocks on a full pipe.
            threading.Thread(target=lambda p=proc: [None for _ in p.stderr],
                             daemon=True).start()
        return self.servers

    def kill(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait()


@pytest.fixture
def shards():
    s = Shards()
    yield s
    s.kill()
