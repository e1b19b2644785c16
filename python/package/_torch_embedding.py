"""Sparse embedding tables kept on the asyncps servers, as torch.nn modules
(docs/SPARSE.md): asyncps.torch.Embedding and asyncps.torch.EmbeddingBag,
imported from there.
"""

import numpy as np
import torch


class _Rows(torch.autograd.Function):
    """The rows of `ids` pulled from the servers; backward pushes their
    gradient (only the rows the batch touched) to the servers."""

    @staticmethod
    def forward(ctx, ids, anchor, table):
        flat = ids.detach().reshape(-1).to("cpu", torch.int64).numpy()
        rows = table._take_prefetched(flat)
        if rows is None:
            rows = table.client.pull_rows(table.name, flat)
        ctx.table, ctx.flat = table, flat
        return torch.from_numpy(rows).view(
            *ids.shape, table.embedding_dim).to(anchor.device)

    @staticmethod
    def backward(ctx, grad):
        table = ctx.table
        g = grad.detach().reshape(-1, table.embedding_dim).to(
            "cpu", torch.float32).contiguous().numpy()
        if table._next is None:
            table.client.push_rows(table.name, ctx.flat, g)
        else:  # The next batch's rows come back with this push.
            table._prefetched = (table._next, table.client.push_pull_rows(
                table.name, ctx.flat, g, table._next))
            table._next = None
        return None, None, None


class Embedding(torch.nn.Module):
    """A sparse embedding table kept on the asyncps servers
    (docs/SPARSE.md): forward pulls the rows of the batch's ids, backward
    pushes their gradient, so only the rows a batch touches travel. The
    servers apply the table's own optimizer to those rows (adagrad, sgd,
    adam: lazy, per-row steps), so the module has no parameters: the dense
    part of the model trains through DistributedOptimizer (or any
    optimizer), this part trains as backward() runs.

        emb = asyncps.torch.Embedding(None, 32, client=client, name="user",
                                      optimizer="adagrad", lr=0.05)

    num_embeddings None: an unbounded table (any int64 id: hashed
    features). The first worker to declare the table makes it (rows start
    N(0, init_stddev^2), a function of the seed and the id); the others must
    declare it alike. Rows cross as float32 CPU arrays; the output is on
    the ids' device. The job's mode covers the rows (bsp: each step's mean
    over the workers, forward's pull waiting for the step before; each
    worker must run forward and backward every step).
    """

    def __init__(self, num_embeddings, embedding_dim, client, name,
                 optimizer="adagrad", lr=0.01, init_stddev=0.01, seed=0,
                 **hyper):
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.client = client
        self.name = name
        client.declare_embedding(name, embedding_dim, num_rows=num_embeddings,
                                 optimizer=optimizer, lr=lr,
                                 init_stddev=init_stddev, seed=seed, **hyper)
        # Autograd calls backward only for an output that needs a gradient:
        # an empty tensor that does (not a Parameter: no optimizer sees it).
        self._anchor = torch.empty(0, requires_grad=True)
        self._next = None         # prefetch(): ids the next push fetches.
        self._prefetched = None   # (ids, rows) that push fetched.

    def prefetch(self, ids):
        """Says which ids the next forward will look up (e.g. the next
        batch's), so the next backward's push brings their rows back in the
        same round trip (push_pull_rows) instead of forward pulling them.
        The rows are read just after this push is applied, so in async
        training they may miss other workers' pushes that land between that
        and the next forward (as a pull at any moment may). A forward with
        other ids pulls as usual."""
        self._next = torch.as_tensor(ids).reshape(-1).to(
            "cpu", torch.int64).numpy().copy()

    def _take_prefetched(self, flat):
        """The prefetched rows if `flat` is what was prefetched, else None."""
        got, self._prefetched = self._prefetched, None
        if got is not None and np.array_equal(got[0], flat):
            return got[1]
        return None

    def forward(self, ids):
        anchor = self._anchor if self._anchor.device == ids.device else \
            self._anchor.detach().to(ids.device).requires_grad_()
        return _Rows.apply(ids, anchor, self)

    def rows(self, ids):
        """The current rows of `ids` (no gradient), e.g. to export."""
        flat = torch.as_tensor(ids).reshape(-1).to("cpu", torch.int64)
        return torch.from_numpy(self.client.pull_rows(self.name,
                                                      flat.numpy()))


class EmbeddingBag(Embedding):
    """Embedding with the rows of each bag pooled ("sum" or "mean"), as
    torch.nn.EmbeddingBag on 2-D ids (batch, bag): forward pulls the rows
    once, backward pushes each row's share of the pooled gradient."""

    def __init__(self, num_embeddings, embedding_dim, client, name,
                 mode="mean", **kwargs):
        if mode not in ("sum", "mean"):
            raise ValueError(f"EmbeddingBag mode {mode!r}: want sum or mean")
        super().__init__(num_embeddings, embedding_dim, client, name,
                         **kwargs)
        self.mode = mode

    def forward(self, ids):
        if ids.dim() != 2:
            raise ValueError("EmbeddingBag: want ids of shape (batch, bag)")
        rows = super().forward(ids)
        return rows.sum(1) if self.mode == "sum" else rows.mean(1)
