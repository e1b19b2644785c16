"""The model of a history check (tools/reliability/history_check.py): the
promises of docs/RELIABILITY.md "The guarantees, and their exact limits" and
docs/MODES.md, judged against the workers' journals, the faults injected
and the final server state. Pure: no process, no network.

What each push may have done, per slice (dense) or per row (rows), from
its final effect a = (initial - final) / gradient (history_worker.py's
pattern makes a count of applications, or in bsp a share 1/n):

- acknowledged: applied once. Lost only where documented: its shard is
  unreplicated and was restarted after the push was sent, and the
  checkpoint it restored was taken before the push was answered (bsp:
  before its step was complete); or it came back dropped (async, ssp: a
  shard restarted since; bsp: late, in a step that was short by design).
- not acknowledged (an error, or its worker SIGKILLed): at most once.
- twice only where an unreplicated shard forgot its ledger: the push was
  in flight across a restart of its shard.
- bsp: every push of a step on one slice (one table's shard) got the same
  share 1/n, n the ranks in the step (a rank without a gradient counts as
  zero); n is the job's ranks unless the step was left by a dead or
  finished rank (a worker fault's window, a rank that left); in an
  elastic job, the ranks that completed the step (their pull after it),
  as they join and leave. A short step
  right after its shard restarted or its group promoted a backup, with
  nobody dead, is `restart_quorum`.
"""

import collections

from tools.reliability import history_worker as hw

RESTARTS = ("shard_kill",)  # Unreplicated: state from a checkpoint.
# An etcd_restart (shard None) may change every group's primary.
PRIMARY_CHANGES = ("shard_kill", "primary_kill", "primary_stop",
                   "etcd_restart")
QUORUM_WINDOW = 15.0  # Seconds after a restart a short step is blamed on it.


class Push:
    """One push call of a worker, from its journal."""

    def __init__(self, ev, rank, gen):
        self.kind, self.slot, self.step = ev["kind"], ev["slot"], ev["step"]
        self.rank, self.gen, self.sent = rank, gen, ev["t"]
        self.tensors = ev.get("tensors", [])
        self.ids = ev.get("ids", [])
        self.outcome, self.answered, self.dropped, self.err = (
            "unknown", None, 0, "")

    def describe(self, t0):
        when = (f"answered t={self.answered - t0:.2f}s"
                if self.answered is not None else "never answered")
        extra = f", dropped {self.dropped}" if self.dropped else ""
        err = f" ({self.err[:80]})" if self.err else ""
        return (f"{self.kind} push rank {self.rank} slot {self.slot} step "
                f"{self.step} sent t={self.sent - t0:.2f}s {self.outcome}"
                f"{err}, {when}{extra}")


class History:
    """Everything a run left: journals, faults, final state."""

    def __init__(self, journals, faults, dense, rows, cfg):
        """`journals`: {(rank, gen): [events]}; `faults`: dicts with t,
        kind, shard or rank, and for a restart `ckpt` (the restored
        checkpoint's time, None if unknown) and `end` (back serving);
        `dense`: {name: array}; `rows`: {id: array}; `cfg`: mode, workers,
        shards, replicated, t0, worker_timeout."""
        self.faults, self.dense, self.rows, self.cfg = faults, dense, rows, cfg
        self.pushes = {}
        # (rank, clock, t, diff); t: when the pull was asked (a journal
        # before 2026-12-08 has only its answer's time).
        self.pulls = []
        self.ends = []  # Times a rank's process ended its run.
        # (rank, time) a process joined the job: its first push or pull (a
        # replacement may take seconds to get in, the job's steps going on
        # without its rank meanwhile).
        self.starts = []
        self._joining = set()  # (rank, gen) started, not yet in.
        for (rank, gen), events in sorted(journals.items()):
            for ev in events:
                self._take(ev, rank, gen)
        self.g = hw.grad_value(cfg["mode"], cfg.get("elastic", False))
        # bsp: the ranks that completed each step (pulled after it): an
        # elastic job's members of that step.
        self.step_ranks = collections.defaultdict(set)
        for rank, clock, _, _ in self.pulls:
            self.step_ranks[clock].add(rank)
        self.place = hw.placement(cfg["shards"])
        self.t0 = cfg["t0"]

    def _take(self, ev, rank, gen):
        e = ev.get("ev")
        if e in ("send", "pull") and (rank, gen) in self._joining:
            self._joining.discard((rank, gen))
            self.starts.append((rank, ev["t"]))
        if e == "send":
            self.pushes[(ev["kind"], ev["slot"])] = Push(ev, rank, gen)
        elif e in ("ack", "err") and ev.get("kind") in ("dense", "rows"):
            p = self.pushes.get((ev["kind"], ev["slot"]))
            if p is not None:
                p.outcome = "acked" if e == "ack" else "error"
                p.answered = ev["t"]
                p.dropped = ev.get("dropped", 0)
                p.err = ev.get("err", "")
        elif e == "pull":
            self.pulls.append(
                (rank, ev["clock"], ev.get("asked", ev["t"]), ev["diff"]))
        elif e == "end":
            self.ends.append(ev["t"])
        elif e == "start":
            self._joining.add((rank, gen))

    # Allowances: the documented limits, each a predicate on the faults.

    def restarts(self, shard):
        if self.cfg["replicated"]:
            return []
        return [f for f in self.faults
                if f["kind"] in RESTARTS and f["shard"] == shard]

    def step_done(self, p):
        """bsp: when the step of `p` was complete at the latest (the last
        answer to a push of it or the next step; None: unknown)."""
        if self.cfg["mode"] != "bsp":
            return p.answered
        last = p.answered
        for q in self.by_step.get(p.step, []) + self.by_step.get(
                p.step + 1, []):
            if q.answered is None:
                return None
            last = max(last or q.answered, q.answered)
        return last

    def may_lose(self, p, shard):
        """Lost with a restart: sent before it, done after its checkpoint."""
        done = self.step_done(p)
        for f in self.restarts(shard):
            ckpt = f.get("ckpt")
            if p.sent < f["killed"] and (done is None or ckpt is None or
                                         done >= ckpt):
                return f
        return None

    def may_repeat(self, p, shard):
        """Applied twice: in flight across a restart (ledger forgotten)."""
        for f in self.restarts(shard):
            if p.sent < f["killed"] and (p.answered is None or
                                         p.answered > f["t"]):
                return f
        return None

    def redone(self, p):
        """bsp: `p` came back dropped as late in a step that an earlier
        generation of its rank had passed (it had a push of that step or a
        later one acknowledged; a step without its push counted it as
        zero), or in the step that generation died in (completed without
        the dead rank once it was silent for --worker_timeout): a
        replacement that resumed behind the job (at the clock its shard
        still knew: after a restart from a checkpoint, or a failover whose
        backup had not seen that rank's last pushes) redoes steps whose
        share of that rank is in, or was given up."""
        return bool(p.dropped) and any(
            q.rank == p.rank and q.gen < p.gen and q.step >= p.step - 1 and
            q.outcome == "acked" for q in self.pushes.values())

    def restarted_before(self, p, shard):
        return any(f["t"] < (p.answered or float("inf"))
                   for f in self.restarts(shard))

    def short_allowed(self, lo, hi):
        """A step sent in [lo, hi] may be short: a worker was dead or
        stalled then, or a rank had finished."""
        for f in self.faults:
            if f["kind"] in ("worker_kill", "worker_exit") and (
                    f["t"] - 0.5 <= hi and lo <= self.back(f) + 2.0):
                return True
        return any(t - 1.0 <= hi for t in self.ends)

    def back(self, f):
        """When the replacement of a killed worker joined (its journal's
        first push or pull), or the end of the run."""
        starts = [t for r, t in self.starts if r == f["rank"] and t > f["t"]]
        return min(starts, default=float("inf"))

    def recent_change(self, shard, lo):
        """The latest primary change (restart, promotion) of `shard` in
        the QUORUM_WINDOW before `lo`, or None."""
        found = None
        for f in self.faults:
            if (f["kind"] in PRIMARY_CHANGES and f["shard"] in (shard, None)
                    and
                    f["t"] <= lo + 1.0 and lo - f["t"] <= QUORUM_WINDOW):
                found = f
        return found

    def faults_before(self, t):
        out = [f for f in self.faults if f["t"] <= t]
        return "; ".join(fault_text(f, self.t0) for f in out[-4:]) or "none"


def fault_text(f, t0):
    who = (f"rank {f['rank']}" if "rank" in f and f.get("shard") is None
           else f"shard {f['shard']}")
    if f["kind"] == "drop_conn":
        who = f"rank {f['rank']} to shard {f['shard']}"
    if f["kind"] == "etcd_restart":
        who = "(every group)"
    text = f"t={f['t'] - t0:.2f}s {f['kind']} {who}"
    if f.get("ckpt") is not None:
        text += f" (checkpoint of t={f['ckpt'] - t0:.2f}s restored)"
    return text


class Checker:
    """Judges a History; `violations` lists (kind, line)."""

    def __init__(self, history, label):
        self.h, self.label = history, label
        self.violations = []
        h = history
        h.by_step = collections.defaultdict(list)
        for p in h.pushes.values():
            h.by_step[p.step].append(p)

    def add(self, kind, what, p, expected, got, shard):
        h = self.h
        line = (f"{self.label}: VIOLATION {kind}: {what} (shard {shard}): "
                f"expected {expected}, got {got}; {p.describe(h.t0)}; faults "
                f"before: {h.faults_before(p.answered or p.sent)}")
        self.violations.append((kind, line))

    def observations(self):
        """(push, unit, shard, share, where) for every slice and row a push
        touched: share = applications (bsp: the share 1/n)."""
        h = self.h
        for p in h.pushes.values():
            if p.kind == "dense":
                for t in p.tensors:
                    e = hw.element(t, p.slot)
                    k = e // hw.SLICE
                    init = float(hw.initial(t)[e])
                    got = float(h.dense[hw.NAMES[t]][e])
                    yield (p, ("dense", t, k), h.place[(t, k)],
                           (init - got) / h.g,
                           f"tensor {hw.NAMES[t]} element {e} slice {k}",
                           init, got)
            else:
                for rid in sorted(set(p.ids)):
                    row = h.rows[rid]
                    if row[0] != row[-1]:
                        self.add("row_mismatch", f"row {rid} columns differ",
                                 p, "equal columns", list(row), "?")
                    mult = hw.row_multiplicity(rid)
                    got = float(row[0])
                    shard = hw.row_shard(rid, h.cfg["shards"])
                    yield (p, ("rows", shard), shard,
                           -got / (h.g * mult), f"row {rid} of {hw.TABLE}",
                           0.0, got)

    def run(self):
        self.phantoms()
        obs = list(self.observations())
        if self.h.cfg["mode"] == "bsp":
            self.judge_bsp(obs)
            self.judge_pulls()
        else:
            for o in obs:
                self.judge_async(*o)
        return self.violations

    def judge_async(self, p, unit, shard, a, where, init, got):
        h = self.h
        kind_lost = "lost_ack" if p.kind == "dense" else "row_mismatch"
        kind_twice = "double_apply" if p.kind == "dense" else "row_mismatch"
        once = f"{init - h.g} (applied once)"
        if a != int(a) or a < 0:
            self.add("bad_value", where, p, f"a whole number of "
                     f"applications", f"{got} ({a} applications)", shard)
        elif a == 0 and p.outcome == "acked":
            if h.may_lose(p, shard):
                return
            if p.dropped and h.restarted_before(p, shard):
                return
            kind = "dropped_push" if p.dropped else kind_lost
            self.add(kind, where, p, once, f"{got} (not applied)", shard)
        elif a == 2 and h.may_repeat(p, shard):
            return
        elif a >= 2:
            self.add(kind_twice, where, p, f"at most once", f"{got} "
                     f"(applied {int(a)} times)", shard)

    def expected_ranks(self, step):
        """bsp: the ranks a step is the mean over (elastic: its members;
        0 where no rank's pull after it was journaled)."""
        h = self.h
        if h.cfg.get("elastic"):
            return len(h.step_ranks.get(step, ()))
        return h.cfg["workers"]

    def judge_bsp(self, obs):
        h = self.h
        groups = collections.defaultdict(list)
        for o in obs:
            groups[(o[0].step, o[1])].append(o)
        most = len(hw.ALL_RANKS) if h.cfg.get("elastic") else h.cfg["workers"]
        for (step, unit), items in sorted(groups.items(), key=str):
            workers = self.expected_ranks(step)
            pushes = [o[0] for o in items]
            lo = min(p.sent for p in pushes)
            hi = max(p.answered or p.sent for p in pushes)
            shard = items[0][2]
            shares = sorted({o[3] for o in items if o[3] != 0})
            n_seen = None
            for p, _, _, a, where, init, got in items:
                if a != 0 and (a <= 0 or abs(1 / a - round(1 / a)) > 1e-9
                               or round(1 / a) > most):
                    self.add("bad_value", where, p, "a share 1/n of the "
                             "gradient", f"{got} (share {a})", shard)
            if len(shares) > 1:
                p, where = items[0][0], items[0][4]
                self.add("bsp_step_mismatch", f"step {step} {where}", p,
                         "one share for every push of the step",
                         f"shares {shares}", shard)
            elif shares and shares[0] > 0:
                n_seen = round(1 / shares[0])
            change = h.recent_change(shard, lo)
            short_ok = h.short_allowed(lo, hi)
            if n_seen is not None and n_seen < workers and not short_ok:
                kind = "restart_quorum" if change else "bsp_step_mismatch"
                p, where, init = items[0][0], items[0][4], items[0][5]
                self.add(kind, f"step {step} {where}", p, f"the mean over "
                         f"{workers} ranks (share 1/{workers})",
                         f"share 1/{n_seen} ({len(pushes)} pushes)", shard)
            for p, _, _, a, where, init, got in items:
                self.judge_bsp_zero(p, a, where, init, got, shard, short_ok,
                                    change, n_seen, max(workers, 1))

    def judge_bsp_zero(self, p, a, where, init, got, shard, short_ok, change,
                       n_seen, workers):
        h = self.h
        if a != 0 or p.outcome != "acked" or h.may_lose(p, shard):
            return
        silent = p.kind == "rows"  # A late row push is dropped silently.
        if (p.dropped or silent) and short_ok or h.redone(p):
            return
        if change and (p.dropped or silent or n_seen is None or
                       n_seen < workers):
            # Dropped as late from a step the restarted shard completed
            # with the ranks it had heard since (or answered as applied).
            kind = "restart_quorum"
        elif p.kind == "rows":
            kind = "row_mismatch"
        else:
            kind = "dropped_push" if p.dropped else "lost_ack"
        self.add(kind, where, p, f"a share of the step (1/"
                 f"{workers}: {init - h.g / workers})",
                 f"{got} (not applied)", shard)

    def phantoms(self):
        """An element that moved with no push of it, or a row likewise."""
        h = self.h
        for t, name in enumerate(hw.NAMES):
            init = hw.initial(t)
            for e in (h.dense[name] != init).nonzero()[0]:
                p = h.pushes.get(("dense", hw.slot_of(t, int(e))))
                if p is None or t not in p.tensors:
                    self.violations.append((
                        "phantom_update", f"{self.label}: VIOLATION "
                        f"phantom_update: tensor {name} element {int(e)}: "
                        f"expected {init[e]} (no push sent it), got "
                        f"{h.dense[name][e]}"))
        for rid, row in h.rows.items():
            p = h.pushes.get(("rows", (rid // 1000003) - 1))
            if (p is None or rid not in p.ids) and any(row != 0):
                self.violations.append((
                    "row_mismatch", f"{self.label}: VIOLATION row_mismatch: "
                    f"row {rid}: expected 0 (no push sent it), got "
                    f"{list(row)}"))

    def judge_pulls(self):
        """bsp: what a rank pulled after a step agrees with the end."""
        h = self.h
        for rank, clock, t, diff in h.pulls:
            for ti, e, v in diff:
                p = h.pushes.get(("dense", hw.slot_of(ti, e)))
                name = hw.NAMES[ti]
                shard = h.place[(ti, e // hw.SLICE)]
                if p is None or ti not in p.tensors:
                    self.violations.append((
                        "phantom_update", f"{self.label}: VIOLATION "
                        f"phantom_update: rank {rank} pulled {name}[{e}] = "
                        f"{v} after step {clock}, no push sent it"))
                    continue
                # A restart after the pull was asked (its SIGKILL, not the
                # fault's start: the pull may win that race; and the
                # pull's start, not the journal's time of its answer: the
                # old process may have answered just before its SIGKILL,
                # 2026-12-08, seed 2 bsp/rows in the suite) may roll the
                # step back to the checkpoint before it.
                later = [f for f in h.restarts(shard)
                         if f.get("killed", f["t"]) > t]
                final = float(h.dense[name][e])
                where = (f"tensor {name} element {e} as rank {rank} pulled "
                         f"it after step {clock}")
                if p.step > clock + 1:
                    self.add("bsp_step_mismatch", where, p, "no update "
                             f"of step {p.step} yet", v, shard)
                elif v != final and not later:
                    self.add("bsp_step_mismatch", where, p, f"{final} (the "
                             "step's update, as at the end)", v, shard)
