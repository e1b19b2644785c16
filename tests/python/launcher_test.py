"""python3 -m asyncps.run against real ps_server processes: two workers
finish; a worker killed mid-run is started again and the job finishes; a
bad script exits non-zero with its error; asyncps.Client() adopts what the
launcher set, and the servers' mode; nothing is left running."""

import os
import socket
import subprocess
import sys
import textwrap

import pytest

import asyncps

SERVER = os.environ.get("ASYNCPS_PS_SERVER", "server/ps_server")

WORKER = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    import asyncps
    client = asyncps.Client()  # Everything from the launcher.
    rank = client.rank
    with open(os.path.join(sys.argv[1], f"ports{rank}"), "w") as f:
        f.write(os.environ["ASYNCPS_SERVERS"])
    client.declare({"w": np.zeros(4, np.float32)}, optimizer="sgd", lr=0.5)
    marker = os.path.join(sys.argv[1], "killed")
    for step in range(20):
        if rank == 1 and step == 5 and sys.argv[2] == "die-once" \\
                and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        # Push and pull the step's weights (in bsp the pull waits for the
        # step: a push of the next one before it is applied is refused).
        client.push_pull({"w": np.ones(4, np.float32)})
    print(f"done rank {rank} of {os.environ['WORLD_SIZE']} "
          f"mode {client.mode}", flush=True)
    client.leave()
""")


def launch(tmp_path, *args, script_args=("ok",)):
    script = tmp_path / "train.py"
    script.write_text(WORKER)
    return subprocess.run(
        [sys.executable, "-m", "asyncps.run", "--ps_server", SERVER, *args,
         "--", str(script), str(tmp_path), *script_args],
        capture_output=True, text=True, timeout=120)


def nothing_listens(tmp_path):
    for name in os.listdir(tmp_path):
        if not name.startswith("ports"):
            continue
        for server in (tmp_path / name).read_text().split(","):
            host, port = server.rsplit(":", 1)
            with socket.socket() as s:
                assert s.connect_ex((host, int(port))) != 0, server


@pytest.mark.parametrize("mode", ["async", "bsp"])
def test_two_workers_finish_and_nothing_is_left(tmp_path, mode):
    out = launch(tmp_path, "--shards", "2", "--workers", "2", "--mode", mode)
    assert out.returncode == 0, out.stderr
    for rank in range(2):
        assert f"done rank {rank} of 2 mode {mode}" in out.stdout, out.stdout
    nothing_listens(tmp_path)


def test_a_killed_worker_is_started_again(tmp_path):
    # The replacement takes rank 1 once the dead one has been silent for
    # --worker_timeout (2 s here, 10 s by default).
    out = launch(tmp_path, "--shards", "2", "--workers", "2",
                 "--server_flag=--worker_timeout=2s",
                 script_args=("die-once",))
    assert out.returncode == 0, out.stderr
    assert "worker 1 failed (-9); starting it again (1/3)" in out.stderr
    assert "done rank 1 of 2" in out.stdout and "done rank 0 of 2" in out.stdout
    nothing_listens(tmp_path)


def test_a_bad_script_exits_non_zero_with_its_error(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text("raise ValueError('this script is broken')\n")
    out = subprocess.run(
        [sys.executable, "-m", "asyncps.run", "--ps_server", SERVER,
         "--max_restarts", "1", "--", str(script)],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    # Its error, twice: it was tried again once.
    assert out.stderr.count("ValueError: this script is broken") == 2
    assert "--max_restarts=1 are used up" in out.stderr


def test_cluster_command_line_runs_a_command_then_stops_the_shards(tmp_path):
    # What the bash tools do: the command gets the servers in its arguments
    # and environment, its status is the launcher's, and no shard is left.
    probe = ("import os, sys; open(sys.argv[1], 'w').write("
             "sys.argv[2] + ' ' + os.environ['ASYNCPS_SERVERS']); "
             "sys.exit(7)")
    out = subprocess.run(
        [sys.executable, "-m", "asyncps.cluster", "--ps_server", SERVER,
         "--shards", "2", "--mode", "bsp", "--", sys.executable, "-c", probe,
         str(tmp_path / "ports0"), "{servers}"],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 7, out.stderr
    given, env = (tmp_path / "ports0").read_text().split(" ")
    assert given == env == out.stdout.strip()
    assert len(env.split(",")) == 2
    (tmp_path / "ports0").write_text(env)
    nothing_listens(tmp_path)


def test_cluster_command_line_serves_until_sigterm(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncps.cluster", "--ps_server", SERVER,
         "--shards", "1", "--log_dir", str(tmp_path)],
        stdout=subprocess.PIPE, text=True)
    servers = proc.stdout.readline().strip()
    host, port = servers.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10):
        pass  # It serves.
    proc.terminate()
    assert proc.wait(timeout=30) == 0
    (tmp_path / "ports0").write_text(servers)
    nothing_listens(tmp_path)
    assert (tmp_path / "server0.log").exists()


def test_cluster_command_line_names_a_shard_that_cannot_start(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "asyncps.cluster", "--ps_server", SERVER,
         "--server_flag=--no_such_flag", "--", "true"],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "shard 0 exited with status 1 before serving" in out.stderr


def test_the_module_and_the_binaries_say_one_version():
    # asyncps.__version__ and common/build_info.h's kAsyncpsVersion are
    # written in two places; a release must change both.
    out = subprocess.run([SERVER, "--version"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0
    assert f"(asyncps {asyncps.__version__}, commit " in out.stdout, out.stdout


def test_bad_launcher_arguments_are_named(tmp_path):
    out = subprocess.run([sys.executable, "-m", "asyncps.run", "--workers",
                          "2"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no script" in out.stderr
    out = subprocess.run([sys.executable, "-m", "asyncps.run", "--",
                          str(tmp_path / "missing.py")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no script" in out.stderr
    script = tmp_path / "train.py"
    script.write_text("")
    out = subprocess.run([sys.executable, "-m", "asyncps.run", "--mode",
                          "allreduce", "--", str(script)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "asyncps.Client has no all-reduce" in \
        out.stderr, out.stderr


def test_client_adopts_the_servers_mode_and_names_a_mismatch(shards,
                                                             monkeypatch):
    servers = ",".join(shards.start(1, "--mode=ssp"))
    monkeypatch.setenv("ASYNCPS_SERVERS", servers)
    monkeypatch.delenv("ASYNCPS_MODE", raising=False)
    with asyncps.Client() as c:
        assert c.mode == "ssp" and c.num_workers == 1
    with pytest.raises(RuntimeError, match="runs --mode=ssp.*--mode=bsp"):
        asyncps.Client(mode="bsp")
    monkeypatch.delenv("ASYNCPS_SERVERS")
    with pytest.raises(ValueError, match="no servers"):
        asyncps.Client()


PSCTL = os.environ.get("ASYNCPS_PSCTL", "tools/psctl")


def test_python_workers_progress_reaches_psctl_status(shards):
    """A DistributedOptimizer's steps, loss and samples reach the servers
    on heartbeats: psctl status shows them, as for ps_worker."""
    import torch
    import asyncps.torch
    servers = ",".join(shards.start(1))
    model = torch.nn.Linear(4, 1)
    client = asyncps.Client(servers, rank=0, num_workers=1, heartbeat=0.05)
    opt = asyncps.torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), client,
        named_parameters=model.named_parameters())
    x = torch.ones(8, 4)
    for _ in range(3):
        opt.zero_grad()
        loss = (model(x) ** 2).mean()
        loss.backward()
        opt.step()
        opt.report(loss=1.2345, samples=len(x))
    # Heartbeats go every 50 ms: ask until one carried the report.
    for _ in range(200):
        out = subprocess.run([PSCTL, f"--servers={servers}", "status"],
                             capture_output=True, text=True, timeout=30)
        lines = out.stdout.splitlines()
        workers = lines[next((i for i, l in enumerate(lines)
                              if l.startswith("rank")), len(lines)):]
        row = [l for l in workers if l.startswith("0 ")]
        if row and "1.2345" in row[0]:
            break
    else:
        pytest.fail(f"no progress in psctl status:\n{out.stdout}")
    assert row[0].split()[2] == "3", row  # Its clock: three steps.
    opt.close()


def test_psctl_export_writes_every_tensor_by_name(shards, tmp_path):
    """psctl export --format=npz: numpy loads every tensor, by name and
    shape, equal to what the servers serve; bad flags are named."""
    import numpy as np
    import torch
    import asyncps.torch
    servers = ",".join(shards.start(2))
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3))
    client = asyncps.Client(servers, rank=0, num_workers=1, slice_bytes=64)
    opt = asyncps.torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), client,
        named_parameters=model.named_parameters())
    model(torch.ones(2, 5)).sum().backward()
    opt.step()
    out = tmp_path / "model.npz"
    done = subprocess.run([PSCTL, f"--servers={servers}", "export",
                           "--format=npz", f"--out={out}"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    saved = np.load(out)
    assert sorted(saved.files) == sorted(n for n, _ in model.named_parameters())
    for name, p in model.named_parameters():
        assert saved[name].shape == tuple(p.shape), name
        np.testing.assert_array_equal(saved[name], p.detach().numpy(),
                                      err_msg=name)
    bad = subprocess.run([PSCTL, f"--servers={servers}", "export",
                          "--format=csv", f"--out={out}"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "--format=csv" in bad.stderr
    missing = subprocess.run([PSCTL, f"--servers={servers}", "export"],
                             capture_output=True, text=True, timeout=30)
    assert missing.returncode == 2 and "--out=FILE is required" in missing.stderr
    opt.close()


EXAMPLE = os.environ.get("ASYNCPS_EXAMPLE", "python/examples/fashion_cnn.py")


def two_by_two(mode, *command, timeout=300):
    """`command` under the launcher: 2 shards, 2 workers, `mode`; it must
    exit 0."""
    out = subprocess.run(
        [sys.executable, "-m", "asyncps.run", "--ps_server", SERVER,
         "--shards", "2", "--workers", "2", "--mode", mode, "--", *command],
        capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-2000:]
    return out


def test_the_cnn_example_runs_through_the_launcher(tmp_path):
    """The Fashion-MNIST example, as docs/PYTHON.md runs it: DataLoader,
    scheduler, clipping, asyncps.Client from the launcher's environment."""
    out = two_by_two("async", EXAMPLE, "--steps=25", "--log_every=0")
    assert "done: rank 0" in out.stdout and "done: rank 1" in out.stdout


PS_WORKER = os.environ.get("ASYNCPS_PS_WORKER", "worker/ps_worker")


def test_a_command_not_python_runs_as_it_is_and_ps_worker_adopts_the_job():
    """ps_worker under the launcher, with no flag naming the job: it takes
    the servers, rank, workers and mode from the launcher's variables (bsp:
    both ranks end on the same weights)."""
    out = two_by_two("bsp", PS_WORKER, "--steps=6", "--log_every=0",
                     timeout=120)
    done = [line for line in out.stdout.splitlines() if " done: " in line]
    assert sorted(line.split()[1] for line in done) == ["0", "1"], out.stdout
    weights = {line.split("weights ")[1].split()[0] for line in done}
    assert len(weights) == 1, done


def test_ps_worker_names_a_bad_launcher_variable_and_a_flag_wins():
    env = dict(os.environ, ASYNCPS_RANK="x")
    bad = subprocess.run([PS_WORKER, "--steps=1"], env=env,
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2
    assert "$ASYNCPS_RANK='x' is not a valid --rank" in bad.stderr
    # Given on the command line, --rank is not read from the variable.
    flag = subprocess.run([PS_WORKER, "--rank=0", "--num_workers=0"],
                          env=env, capture_output=True, text=True,
                          timeout=30)
    assert flag.returncode == 2 and "ASYNCPS_RANK" not in flag.stderr
    assert "num_workers" in flag.stderr
