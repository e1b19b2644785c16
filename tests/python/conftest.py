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
            self._launch(shard, n, 0, flags)
        return self.servers

    def restart(self, shard, *flags):
        """SIGKILLs `shard` and starts it again on the same port."""
        proc, n, port, _ = self.procs[shard]
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self._launch(shard, n, port, flags)

    def _launch(self, shard, n, port, flags):
        proc = subprocess.Popen(
            [SERVER, "--host=127.0.0.1", f"--port={port}", "--data_port=0",
             f"--shard={shard}", f"--num_shards={n}", *flags],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        # Its log says where it serves (no sleep: the line is the signal).
        for line in proc.stderr:
            match = SERVING.search(line)
            if match:
                port = int(match.group(1))
                break
        else:
            raise RuntimeError(f"shard {shard} exited: {proc.wait()}")
        # Keep draining its log so it never blocks on a full pipe.
        threading.Thread(target=lambda p=proc: [None for _ in p.stderr],
                         daemon=True).start()
        if shard < len(self.procs):
            self.procs[shard] = (proc, n, port, flags)
        else:
            self.procs.append((proc, n, port, flags))
            self.servers.append(f"127.0.0.1:{port}")

    def kill(self):
        for proc, _, _, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait()


@pytest.fixture
def shards():
    s = Shards()
    yield s
    s.kill()
