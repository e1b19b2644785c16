"""The CTR workload (asyncps.ctr and tools/experiments/ctr_experiment.py): the
generator is deterministic and spreads its ids as documented, its AUC is
exact, and a short asyncps run with the table on two real shards learns
(AUC well above 0.5)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from asyncps.ctr import CtrData, auc


def test_auc_matches_pair_counting_with_ties():
    rng = np.random.default_rng(4)
    scores = rng.integers(0, 5, 300).astype(float)  # Many ties.
    labels = rng.random(300) < 0.4
    pos, neg = scores[labels], scores[~labels]
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (
        pos[:, None] == neg[None, :]).sum()
    assert auc(scores, labels) == pytest.approx(wins / (pos.size * neg.size))
    assert auc([0.1, 0.9], [0, 1]) == 1.0
    with pytest.raises(ValueError):
        auc([0.1, 0.2], [1, 1])


def test_generator_is_deterministic_and_spreads_ids_by_field():
    data = CtrData(100_000, seed=5)
    assert sum(data.vocab) == 100_000 and len(data.vocab) == 8
    ids, labels = data.batch(3, 4096)
    again, labels2 = CtrData(100_000, seed=5).batch(3, 4096)
    np.testing.assert_array_equal(ids, again)
    np.testing.assert_array_equal(labels, labels2)
    assert not np.array_equal(ids, data.batch(4, 4096)[0])
    for f in range(8):
        lo = data.offsets[f]
        assert ((ids[:, f] >= lo) & (ids[:, f] < lo + data.vocab[f])).all()
        # Zipf popularity, permuted: the most common value is not row 0 of
        # the field, and a few values take a large share.
        values, counts = np.unique(ids[:, f], return_counts=True)
        assert counts.max() > 20 * np.median(counts)
    assert 0.2 < labels.mean() < 0.45
    best = data.best_auc(20_000)
    assert 0.75 < best < 0.85  # The true model: what a learner aims at.
    with pytest.raises(ValueError):
        CtrData(10, fields=8)


def test_short_async_run_learns(tmp_path):
    tool = os.environ["ASYNCPS_CTR_EXPERIMENT"]
    out = subprocess.run(
        [sys.executable, tool, "--rows", "1000000", "--samples", "61440",
         "--eval_every", "30720", "--test", "10000", "--configs", "async",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    line = json.loads(out.stdout.splitlines()[-1])
    assert line["config"] == "async" and line["samples"] == 61440
    assert line["auc"] > 0.6, line  # Chance is 0.5; the best here ~0.79.
    assert line["auc"] < line["best_auc"]
    curve = json.load(open(tmp_path / "ctr.json"))[0]["curve"]
    assert curve[0][2] < line["auc"]  # Trained beats untrained.
    assert (tmp_path / "auc.png").stat().st_size > 0


def test_admission_and_ttl_flags(tmp_path):
    """--row_admit_count and --row_ttl reach the table (issue #43): a short
    run with both learns; bad values are refused naming the flag."""
    tool = os.environ["ASYNCPS_CTR_EXPERIMENT"]
    base = [sys.executable, tool, "--rows", "1000000", "--samples", "30720",
            "--eval_every", "30720", "--test", "5000", "--configs", "async"]
    out = subprocess.run(base + ["--row_admit_count", "2", "--row_ttl", "200"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    line = json.loads(out.stdout.splitlines()[-1])
    assert line["auc"] > 0.55, line
    for bad, words in ((["--row_admit_count", "0"], "--row_admit_count 0"),
                       (["--row_ttl", "0"], "--row_ttl 0")):
        r = subprocess.run(base + bad, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 2 and words in r.stderr, r.stderr
