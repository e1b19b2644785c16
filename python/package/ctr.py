"""A synthetic click-through-rate data set drawn from a known model, so the
best achievable AUC is known (docs/SPARSE.md).

    data = CtrData(num_rows=10_000_000, seed=0)
    ids, labels = data.batch(i, 512)       # batch i of the training stream
    test_ids, test_labels, p = data.test_set(20_000)
    data.best_auc(20_000)                  # the true model's AUC there

Each example has `fields` categorical features. Field f has vocab[f] values
(the fields share `num_rows` unevenly, as real ones do: a few huge, e.g.
user and item ids, and several small), drawn with Zipf(alpha) popularity:
the value of popularity rank r is a fixed permutation of r, so popular
values are spread over the field's range, not its first rows. A feature's
id is its row in one table of `num_rows` rows: offsets[f] + value.

Labels come from a factorization machine with hidden parameters that are a
function of the seed and the id (nothing stored, so 10 M rows cost
nothing): logit = bias + sum_f w[id_f] + sum_{f<g} <v[id_f], v[id_g]>,
w ~ N(0, 0.3^2), v ~ N(0, 0.3^2 I_4); label ~ Bernoulli(sigmoid(logit)).
Every batch is a function of (seed, stream, index), so workers, processes
and runs see the same examples. Needs numpy only.
"""

import math

import numpy as np

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)
# The share of the rows each field gets (normalised to the field count).
_SHARES = (0.3, 0.2, 0.15, 0.1, 0.1, 0.07, 0.05, 0.03)


def _mix(x):
    """splitmix64's finaliser over a uint64 array (wrapping arithmetic)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _normal(ids, seed, stream):
    """N(0, 1) per id, a function of (seed, stream, id) alone."""
    with np.errstate(over="ignore"):
        base = _mix(ids.astype(np.uint64) ^ np.uint64(seed * 0x100000001B3))
        a = _mix(base ^ np.uint64(2 * stream + 1))
        b = _mix(base ^ np.uint64(2 * stream + 2))
    u1 = ((a >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53
    u2 = (b >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2)


def auc(scores, labels):
    """Area under the ROC curve (ties share their ranks)."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels).astype(bool)
    pos = int(labels.sum())
    neg = labels.size - pos
    if pos == 0 or neg == 0:
        raise ValueError("auc: want both classes among the labels")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    ranks = np.empty(scores.size, dtype=np.float64)
    # Average rank (1-based) over each run of equal scores.
    edges = np.flatnonzero(np.diff(sorted_scores)) + 1
    starts = np.concatenate(([0], edges))
    ends = np.concatenate((edges, [scores.size]))
    avg = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(avg, ends - starts)
    return float((ranks[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


class CtrData:
    """The data set (see the module's doc)."""

    HIDDEN = 4  # Width of the hidden factors v.

    def __init__(self, num_rows=1_000_000, fields=8, seed=0, alpha=1.05,
                 bias=-1.0, scale=0.3):
        if fields < 2 or fields > len(_SHARES):
            raise ValueError(f"fields={fields}: want 2..{len(_SHARES)}")
        if num_rows < 10 * fields:
            raise ValueError(f"num_rows={num_rows}: want at least "
                             f"{10 * fields} (10 values a field)")
        shares = np.array(_SHARES[:fields])
        vocab = np.maximum((shares / shares.sum() * num_rows).astype(np.int64),
                           10)
        vocab[0] += num_rows - vocab.sum()  # The rows add up exactly.
        self.num_rows = int(num_rows)
        self.fields = fields
        self.seed = int(seed)
        self.alpha = alpha
        self.bias = bias
        self.scale = scale
        self.vocab = [int(v) for v in vocab]
        self.offsets = np.concatenate(([0], np.cumsum(vocab)[:-1])).astype(
            np.int64)
        self._cdf = [None] * fields  # Built on first use (10 M: 80 MB).
        # A bijection of [0, vocab) per field: rank r -> (a r + c) mod vocab.
        self._perm = []
        for f, v in enumerate(self.vocab):
            a = (2654435761 + 7919 * f) % v or 1
            while math.gcd(a, v) != 1:
                a += 1
            self._perm.append((a, (40503 * (f + 1) + self.seed) % v))

    def _values(self, f, u):
        if self._cdf[f] is None:
            ranks = np.arange(1, self.vocab[f] + 1, dtype=np.float64)
            cdf = np.cumsum(ranks**-self.alpha)
            self._cdf[f] = cdf / cdf[-1]
        r = np.minimum(np.searchsorted(self._cdf[f], u, side="right"),
                       self.vocab[f] - 1)
        a, c = self._perm[f]
        return (r * a + c) % self.vocab[f]

    def _examples(self, stream, index, size):
        rng = np.random.default_rng([self.seed, stream, index])
        u = rng.random((size, self.fields))
        ids = np.empty((size, self.fields), dtype=np.int64)
        for f in range(self.fields):
            ids[:, f] = self.offsets[f] + self._values(f, u[:, f])
        p = self.probability(ids)
        labels = (rng.random(size) < p).astype(np.float32)
        return ids, labels, p

    def probability(self, ids):
        """The true model's click probability for rows of ids."""
        ids = np.asarray(ids, dtype=np.int64)
        w = self.scale * _normal(ids, self.seed, 0)
        v = np.stack([self.scale * _normal(ids, self.seed, 1 + j)
                      for j in range(self.HIDDEN)], axis=-1)
        # sum_{f<g} <v_f, v_g> = (|sum_f v_f|^2 - sum_f |v_f|^2) / 2.
        total = v.sum(axis=1)
        pairs = 0.5 * ((total**2).sum(-1) - (v**2).sum(-1).sum(-1))
        logit = self.bias + w.sum(axis=1) + pairs
        return 1.0 / (1.0 + np.exp(-logit))

    def batch(self, index, size):
        """Training batch `index` (any int >= 0): (ids [size, fields] int64,
        labels [size] float32)."""
        ids, labels, _ = self._examples(0, index, size)
        return ids, labels

    def test_set(self, size):
        """Held-out examples: (ids, labels, true probabilities)."""
        return self._examples(1, 0, size)

    def best_auc(self, size):
        """The AUC of the true probabilities on test_set(size): what no
        model can beat there."""
        _, labels, p = self.test_set(size)
        return auc(p, labels)
