#!/usr/bin/python3
"""One worker of a history check (tools/reliability/history_check.py), a process
of its own so that the checker can SIGKILL it mid-push. It also holds the
pattern that the checker and the workers share: which elements and rows a push
touches, with which gradient, so that the final weights say which pushes
were applied and how often.

    history_worker.py --servers S --rank R --workers W --mode M --dir D
                      --seed N [--rows] [--pace SECONDS] [--slots N]
                      [--elastic]

The pattern. The model is TENSORS dense tensors of ELEMS float32 each, cut
by the partitioner into slices of SLICE elements (common/partitioner.h; a
copy of its rule is `placement`). Push number `slot` (unique in the job:
rank R uses slots R*SLOTS .. R*SLOTS+SLOTS-1, or --slots instead of SLOTS
for a job of more ranks (an elastic one's), a restarted process goes on
after the last slot its rank journaled) sends, for each tensor it picks,
GRAD at one element, `element(t, slot)`, and zero elsewhere; the elements
of one push lie in different slices, on both shards. With --rows it also
pushes rows of the table "emb": ids `row_ids(slot)`, one of them twice (a
repeated id's rows are summed). SGD with lr 1 and small integers times a
power of two keep every float32 sum exact, and no two pushes share an
element or a row, so each element's final value counts the applications
of its one push.

The journal. Every event is a JSON line in D/journal-R-G.jsonl (G: this
process's generation for the rank), flushed before a push leaves and after
its answer: a SIGKILL leaves a push "sent" with no outcome (unknown). A
SIGTERM ends the worker after its step: it leaves the job (an elastic
job's worker_leave).
Events: start, send, ack (with the slices dropped), err (the exception's
text), pull (bsp: the elements that changed since this process's previous
pull, with the clock), end.
"""

import argparse
import glob
import json
import os
import random
import signal
import sys
import time

TENSORS = 4
ELEMS = 4096
SLICE = 1024  # Elements: the partitioner's 4 KiB fine cut (this model).
SLOTS = 2048  # Pushes per rank at most (ranks: 2).
DIM = 2  # Embedding row width.
TABLE = "emb"
NAMES = [f"d{t}" for t in range(TENSORS)]
ALL_RANKS = (0, 1, 2, 3)  # An elastic run's, ELEMS / 4 slots each.


def grad_value(mode, elastic=False):
    """bsp divides by the ranks in the step (1 or 2): 2 keeps it whole; an
    elastic job's steps have up to 4 ranks: 12."""
    if mode != "bsp":
        return 1.0
    return 12.0 if elastic else 2.0


def element(t, slot):
    """The element of tensor t that push `slot` touches: consecutive
    tensors a slice apart, so one push spans slices on every shard."""
    return (slot + t * SLICE) % ELEMS


def slot_of(t, e):
    return (e - t * SLICE) % ELEMS


def initial(t):
    """Tensor t's initial weights: small integers, exact in float32."""
    import numpy as np
    e = np.arange(ELEMS, dtype=np.int64)
    return (((e * 7 + t) % 16) - 8).astype(np.float32)


def row_ids(slot):
    """The ids push `slot` sends rows for; the last repeats (summed)."""
    base = 1000003 * (slot + 1)
    return [base, base + 1, base + 1]


def row_multiplicity(row_id):
    """How many times a push sends row `row_id` (2 for the repeated id)."""
    return 2 if (row_id - 1000003) % 1000003 == 1 else 1


def mix64(x):
    """common/initializer.cc Mix64 (SplitMix64's finaliser)."""
    m = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & m
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
    return x ^ (x >> 31)


def row_shard(row_id, shards):
    """common/partitioner.cc RowShard."""
    return mix64(row_id & ((1 << 64) - 1)) % shards


def placement(shards):
    """{(tensor, slice index): shard}, as Partition::Create places this
    model: equal slices, taken in tensor and index order, each to the
    least-loaded shard (ties to the lowest)."""
    load = [0] * shards
    out = {}
    for t in range(TENSORS):
        for k in range(ELEMS // SLICE):
            s = min(range(shards), key=lambda i: (load[i], i))
            out[(t, k)] = s
            load[s] += SLICE
    return out


def choose(rng, mode, rows):
    """What a push sends: (tensor indices, whether rows). bsp sometimes
    sends no dense gradient at all, or no rows (they count as zero)."""
    tensors = [t for t in range(TENSORS) if rng.random() < 0.7]
    if mode == "bsp" and rng.random() < 0.1:
        tensors = []
    elif not tensors:
        tensors = [rng.randrange(TENSORS)]
    send_rows = rows and rng.random() < 0.8
    return tensors, send_rows


class Journal:
    """This process's journal file; every line flushed at once."""

    def __init__(self, directory, rank, slots=SLOTS):
        gens = glob.glob(os.path.join(directory, f"journal-{rank}-*.jsonl"))
        self.gen = len(gens)
        self.next_slot = rank * slots
        for path in gens:
            for ev in read_journal(path):
                if ev.get("slot") is not None:
                    self.next_slot = max(self.next_slot, ev["slot"] + 1)
        self.path = os.path.join(directory,
                                 f"journal-{rank}-{self.gen}.jsonl")
        self.f = open(self.path, "a")

    def write(self, **ev):
        ev["t"] = time.time()
        self.f.write(json.dumps(ev) + "\n")
        self.f.flush()


def read_journal(path):
    """The events of one journal; a line cut by a SIGKILL is left out."""
    out = []
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--servers", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--mode", required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--rows", action="store_true")
    p.add_argument("--pace", type=float, default=0.03)
    p.add_argument("--slots", type=int, default=SLOTS)
    p.add_argument("--elastic", action="store_true")
    return p.parse_args()


def connect(args, journal):
    import asyncps
    import numpy as np
    client = asyncps.Client(args.servers, rank=args.rank,
                            num_workers=args.workers, mode=args.mode,
                            retry_for=60.0, heartbeat=0.5)
    client.declare({NAMES[t]: initial(t) for t in range(TENSORS)},
                   optimizer="sgd", lr=1.0, momentum=0.0)
    if args.rows:
        client.declare_embedding(TABLE, DIM, optimizer="sgd", lr=1.0,
                                 init_stddev=0.0)
    journal.write(ev="start", rank=args.rank, gen=journal.gen,
                  pid=os.getpid(), clock=client.clock)
    return client, np


def push_dense(client, np, journal, slot, step, tensors, g):
    grads = {}
    for t in tensors:
        a = np.zeros(ELEMS, dtype=np.float32)
        a[element(t, slot)] = g
        grads[NAMES[t]] = a
    journal.write(ev="send", kind="dense", slot=slot, step=step,
                  tensors=tensors)
    try:
        r = client.push(grads)
    except Exception as e:  # Recorded: the checker judges it.
        journal.write(ev="err", kind="dense", slot=slot,
                      err=f"{type(e).__name__}: {e}")
        return e
    journal.write(ev="ack", kind="dense", slot=slot, dropped=r["dropped"])
    return None


def push_rows(client, np, journal, slot, step, g):
    ids = row_ids(slot)
    grads = np.full((len(ids), DIM), g, dtype=np.float32)
    journal.write(ev="send", kind="rows", slot=slot, step=step, ids=ids)
    try:
        client.push_rows(TABLE, np.array(ids, dtype=np.int64), grads)
    except Exception as e:
        journal.write(ev="err", kind="rows", slot=slot,
                      err=f"{type(e).__name__}: {e}")
        return e
    journal.write(ev="ack", kind="rows", slot=slot)
    return None


def pull_diff(client, np, journal, previous, bsp):
    """Pulls every tensor; bsp journals what changed since the last pull
    of this process (the step's update as this rank sees it). A shard that
    lost the model (killed before its first checkpoint) gets it back as the
    API says: recover() with the weights this process holds."""
    asked = time.time()
    try:
        now = client.pull()
    except RuntimeError as e:
        held = (previous if previous is not None else
                {NAMES[t]: initial(t) for t in range(TENSORS)})
        if "FAILED_PRECONDITION" not in str(e) or not client.recover(held):
            raise
        journal.write(ev="recover", clock=client.clock)
        asked = time.time()
        now = client.pull()
    if previous is not None and bsp:
        diff = []
        for t, name in enumerate(NAMES):
            for e in np.nonzero(now[name] != previous[name])[0]:
                diff.append([t, int(e), float(now[name][e])])
        # `asked`: the pull's start; the journal's own time is after its
        # answer, which a shard may have sent just before a SIGKILL.
        journal.write(ev="pull", clock=client.clock, diff=diff, asked=asked)
    return now


def run(args):
    journal = Journal(args.dir, args.rank, args.slots)
    rng = random.Random(args.seed * 1000 + args.rank * 100 + journal.gen)
    leaving = []
    signal.signal(signal.SIGTERM, lambda *_: leaving.append(True))
    client, np = connect(args, journal)
    g = grad_value(args.mode, args.elastic)
    stop = os.path.join(args.dir, "stop")
    last = (args.rank + 1) * args.slots
    bsp = args.mode == "bsp"
    previous = pull_diff(client, np, journal, None, bsp)
    failures = 0
    while (journal.next_slot < last and not os.path.exists(stop) and
           not leaving):
        slot = journal.next_slot
        journal.next_slot += 1
        step = client.clock + 1
        tensors, rows = choose(rng, args.mode, args.rows)
        bad = None
        if tensors:
            bad = push_dense(client, np, journal, slot, step, tensors, g)
        if rows and bad is None:
            bad = push_rows(client, np, journal, slot, step, g)
        try:
            client.end_step()
            previous = pull_diff(client, np, journal, previous, bsp)
            if args.rows:  # bsp: every shard's table step, before the next.
                client.pull_rows(TABLE, np.array(row_ids(slot), np.int64))
        except Exception as e:
            journal.write(ev="err", kind="step", slot=slot,
                          err=f"{type(e).__name__}: {e}")
            bad = bad or e
        failures = failures + 1 if bad is not None else 0
        if failures >= 5:
            journal.write(ev="end", why="5 failures in a row")
            return 3
        time.sleep(args.pace)
    client.leave()
    journal.write(ev="end", why="sigterm" if leaving else
                  "stop" if os.path.exists(stop) else "slots")
    return 0


if __name__ == "__main__":
    sys.exit(run(parse()))
