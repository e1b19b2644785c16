"""psctl doctor against real ps_server processes (issue #44): each cause it
names, created for real, and nothing on a healthy job. Its diagnosis from
made-up answers (clock skew, builds, groups, memory limits) is
tests/ops/doctor_test.cc."""

import os
import subprocess
import threading
import time

import numpy as np
import pytest

import asyncps
from asyncps.cluster import Shards

PSCTL = os.environ.get("ASYNCPS_PSCTL", "tools/psctl")


def doctor(servers, *flags):
    """psctl doctor's exit status and output; it must answer within 10 s."""
    start = time.monotonic()
    r = subprocess.run([PSCTL, f"--servers={','.join(servers)}", *flags,
                        "doctor"], capture_output=True, text=True,
                       timeout=30)
    assert time.monotonic() - start < 10, r.stdout
    return r.returncode, r.stdout


def doctor_until(servers, words, deadline=30):
    """Asks until the output holds every one of `words` (a stall is named
    once it is --stall_warn old); fails past `deadline` seconds."""
    end = time.monotonic() + deadline
    while True:
        rc, out = doctor(servers)
        if all(w in out for w in words):
            return rc, out
        assert time.monotonic() < end, out
        time.sleep(0.2)


def test_a_healthy_job_then_a_shard_down(shards):
    servers = shards.start(2)
    with asyncps.Client(servers, rank=0, num_workers=1,
                        retry_for=5.0) as c:
        c.declare({"w": np.zeros(64, np.float32)}, optimizer="sgd", lr=0.1)
        rc, out = doctor(servers)
        assert rc == 0 and "no problem found: 2 of 2" in out, out
    shards.shards[1].kill()
    rc, out = doctor(servers)
    assert rc == 1, out
    assert f"PROBLEM: shard 1 at {servers[1]} is unreachable" in out, out
    assert "shard 0" not in out, out


def test_a_wrong_token(shards, tmp_path):
    right, wrong = tmp_path / "token", tmp_path / "wrong"
    right.write_text("the-token-of-this-job\n")
    wrong.write_text("the-token-of-another-job\n")
    servers = shards.start(1, f"--auth_token_file={right}")
    assert doctor(servers, f"--auth_token_file={right}")[0] == 0
    rc, out = doctor(servers, f"--auth_token_file={wrong}")
    assert rc == 1 and "refuses psctl's credentials" in out, out
    assert "--auth_token_file" in out, out


GEN_CERTS = os.environ.get("ASYNCPS_GEN_CERTS", "deploy/gen_certs.sh")


def test_a_tls_mismatch_either_way(shards, tmp_path):
    """A shard with mutual TLS called in plaintext closes the connection
    without a word: the doctor tries a TLS handshake and names the
    mismatch. psctl with TLS calling a plaintext shard fails its
    handshake, named the same."""
    subprocess.run([GEN_CERTS, str(tmp_path)], check=True,
                   capture_output=True)
    tls = [f"--tls_cert={tmp_path}/server.pem",
           f"--tls_key={tmp_path}/server.key", f"--tls_ca={tmp_path}/ca.pem"]
    secured = shards.start(1, *tls)
    rc, out = doctor(secured)
    assert rc == 1 and "TLS mismatch with shard 0" in out, out
    assert "it speaks TLS and psctl called in plaintext" in out, out
    assert "unreachable" not in out, out
    client = [f"--tls_cert={tmp_path}/client.pem",
              f"--tls_key={tmp_path}/client.key", f"--tls_ca={tmp_path}/ca.pem"]
    assert doctor(secured, *client)[0] == 0
    shards.stop()
    (tmp_path / "plain").mkdir()
    others = Shards(shards.binary, ready_dir=str(tmp_path / "plain"))
    try:
        plain = others.start(1)
        rc, out = doctor(plain, *client)
        assert rc == 1 and "TLS mismatch with shard 0" in out, out
    finally:
        others.kill()
    # A shard that is down is not taken for one that speaks TLS.
    rc, out = doctor(plain)
    assert rc == 1 and "is unreachable" in out and "TLS" not in out, out


def test_a_bsp_step_waiting_on_a_rank_that_pushes_nan(shards):
    servers = shards.start(1, "--mode=bsp", "--stall_warn=1s")
    model = {"w": np.zeros(8, np.float32)}
    with asyncps.Client(servers, rank=0, num_workers=2, retry_for=5.0,
                        heartbeat=0.2) as r0, \
            asyncps.Client(servers, rank=1, num_workers=2, retry_for=5.0,
                           heartbeat=0.2) as r1:
        r0.declare(model, optimizer="sgd", lr=1.0)
        r1.declare(model, optimizer="sgd", lr=1.0)
        with pytest.raises(ValueError, match="NaN"):
            r1.push({"w": np.full(8, np.nan, np.float32)})
        pulled = []

        def step():  # Rank 0's step waits for rank 1's gradient.
            r0.push({"w": np.ones(8, np.float32)})
            r0.end_step()
            pulled.append(r0.pull())

        waiting = threading.Thread(target=step)
        waiting.start()
        rc, out = doctor_until(servers, ["waiting for rank 1",
                                         "rank 1 pushed NaN or Inf 1 time"])
        assert rc == 1, out
        r1.push({"w": np.full(8, 3.0, np.float32)})  # The step completes.
        r1.end_step()
        waiting.join(timeout=30)
        assert not waiting.is_alive()
        np.testing.assert_array_equal(pulled[0]["w"], np.full(8, -2.0))


def test_a_shard_near_its_max_shard_bytes(shards):
    servers = shards.start(1, "--max_shard_bytes=100000")
    with asyncps.Client(servers, rank=0, num_workers=1,
                        retry_for=5.0) as c:
        c.declare({"w": np.zeros(23000, np.float32)}, optimizer="sgd",
                  lr=0.1)  # 92,000 of 100,000 bytes.
        rc, out = doctor(servers)
    assert rc == 1 and "near its --max_shard_bytes" in out, out
