"""A discrete-event simulator of a Shoal cluster: W workers, M models, one policy for
getting requests to workers. Pure: no I/O, no wall clock; seeded.

What it models (perf/scale/README.md says what is measured and what assumed):

- requests: Poisson (or evenly spaced, as perf's load generator sends) arrivals; each
  names a model (Zipf over M), carries 1..8 texts whose token lengths are drawn from the
  perf text sets (short queries, or passages for `passage_share` of requests);
- a worker: one device running one forward pass at a time; its time for a batch is the
  measured curve `base + per_row * rows + per_token * rows * longest`; what it pulls,
  which batch it runs next and at what size are the encoder worker's own policy
  (`EncoderSchedule` over `EncoderModel`s and their `Batcher`s: token budget, coalescing
  window, length grouping) on the simulated clock, so a change to the worker's rules is
  a change to the simulation;
- placement: each model is resident on a number of workers in proportion to its traffic
  (at least one), `resident` models per worker at most, the same for every policy except
  `hash` (which places by a hash ring, as such routers do);
- `pull` (Shoal): one shared queue per model; a worker with room by the worker's rule
  (`EncoderSchedule.room`, `pull_delay`: held jobs, queued batches, the pull horizon) has
  a pull waiting on that model's queue, served in the order pulls were made (as a
  JetStream pull consumer does); a fetch costs the measured fetch time, a publish the
  measured publish time;
- push routers: one router process in front (a FIFO server costing `router_s` a request)
  picks a worker among the model's replicas and sends the request to that worker's own
  queue: `round-robin`, `least-outstanding` (fewest requests it sent that are not
  answered), `power-of-two` (the less loaded of two drawn at random), `hash` (the model's
  replicas by a consistent-hash ring, a request to one of them by its id's hash);
- every request also pays `overhead_s` (client, HTTP, gateway), for every policy alike.
"""

from __future__ import annotations

import hashlib
import heapq
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from shoal.model_registry import BatchProfile, ModelSpec
from shoal.tune.knee import Step, kept_up, quantile
from shoal.workers.adapters.dummy import DummyAdapter
from shoal.workers.batcher import Batcher
from shoal.workers.encoder.model import EncoderModel
from shoal.workers.encoder.schedule import PULL_HORIZON, EncoderSchedule, Run

__all__ = [
    "POLICIES",
    "Cluster",
    "Curve",
    "QueueCosts",
    "Scenario",
    "StepResult",
    "find_knee",
    "run_step",
]

POLICIES = ("pull", "round-robin", "least-outstanding", "power-of-two", "hash")
REQUEST_TIMEOUT = 30.0


@dataclass(frozen=True)
class Curve:
    """Seconds of one forward pass: `base + per_row * rows + per_token * rows * longest`."""

    base_s: float
    per_row_s: float
    per_token_s: float
    label: str = ""

    def seconds(self, rows: int, longest: int) -> float:
        return self.base_s + self.per_row_s * rows + self.per_token_s * rows * longest

    @classmethod
    def calibrated(cls, calibration: dict, label: str) -> Curve:
        """The curve `python -m perf scale calibrate` fitted."""
        c = calibration["curve"]
        return cls(c["base_s"], c["per_row_s"], c["per_token_s"], label)

    def scaled(self, factor: float, label: str) -> Curve:
        return Curve(
            self.base_s * factor, self.per_row_s * factor, self.per_token_s * factor, label
        )


@dataclass(frozen=True)
class QueueCosts:
    """Seconds the queue adds (measured on nats-server by calibrate.py)."""

    publish_s: float = 0.00015
    fetch_s: float = 0.00027
    reply_s: float = 0.00016

    @classmethod
    def calibrated(cls, calibration: dict) -> QueueCosts:
        """The costs `python -m perf scale calibrate` measured; a reply is half a round trip."""
        q = calibration["queue"]
        return cls(q["publish_s"], q["fetch4_s"], q["reply_rtt_s"] / 2)


@dataclass(frozen=True)
class Scenario:
    workers: int
    models: int
    curve: Curve
    short_lengths: Sequence[int]
    passage_lengths: Sequence[int]
    passage_share: float = 0.2
    texts: tuple[int, int] = (1, 8)
    """Texts per request: uniform between the two, inclusive."""
    zipf_s: float = 1.1
    resident: int = 4
    """Models a worker holds at most."""
    queue: QueueCosts = QueueCosts()
    router_s: float = 0.0002
    overhead_s: float = 0.005
    profile: BatchProfile = field(default_factory=BatchProfile)
    max_held: int = 64
    pull_horizon_s: float | None = PULL_HORIZON
    """Pull: the worker's rule (EncoderSchedule); None: `pull-anytime`, a busy worker
    keeps a pull waiting (the rule before the horizon)."""
    arrivals: str = "poisson"
    """`poisson` or `even` (perf's load generator: one every 1/rate seconds)."""


@dataclass
class StepResult:
    step: Step
    utilization: float
    """Share of the workers' time spent in forward passes while requests arrived."""
    mean_batch_rows: float


class _Unit:
    __slots__ = ("cost", "request")

    def __init__(self, cost: int, request: _Request) -> None:
        self.cost = cost
        self.request = request


class _Request:
    __slots__ = ("arrived", "left", "model", "units", "worker")

    def __init__(self, arrived: float, model: int, lengths: list[int]) -> None:
        self.arrived = arrived
        self.model = model
        self.units = [_Unit(n, self) for n in lengths]
        self.left = len(lengths)
        self.worker = -1


class _Worker:
    """A simulated encoder worker: the worker's own `EncoderModel`s and `EncoderSchedule`
    decide what it pulls, which batch runs next and at what size; the curve says how long
    a pass takes (the models' dummy adapter never runs)."""

    __slots__ = (
        "busy_s",
        "held",
        "hosted",
        "id",
        "models",
        "passes",
        "rows",
        "schedule",
        "timer",
        "waiting",
    )

    def __init__(self, wid: int, scenario: Scenario, clock: Callable[[], float]) -> None:
        self.id = wid
        self.hosted: list[int] = []
        self.models: dict[str, EncoderModel] = {}
        self.schedule = EncoderSchedule(
            self.models,
            clock,
            full_threads=1,
            pairs=False,  # the curve is one pass at a time on the whole device
            max_held_jobs=scenario.max_held,
            batch_slice_ms=0.0,  # no batch-lane work is simulated
            pull_horizon=scenario.pull_horizon_s,
        )
        self.held = 0
        self.passes = 0
        self.busy_s = 0.0
        self.rows: list[int] = []
        self.timer: float | None = None
        self.waiting: set[int] = set()
        """Models this worker has a pull waiting on (pull policy)."""

    def host(self, model: int, profile: BatchProfile, clock: Callable[[], float]) -> None:
        spec = ModelSpec(
            id=_name(model),
            tasks=["embed"],
            source="none",
            runtime="dummy",
            dims=1,
            max_length=512,
            profile=profile,
        )
        served = EncoderModel(spec, DummyAdapter(spec), clock)
        served.state = "resident"
        self.hosted.append(model)
        self.models[spec.id] = served

    def batcher(self, model: int) -> Batcher:
        return self.models[_name(model)].batcher("embed", "")


def _name(model: int) -> str:
    return f"m{model}"


def placement(scenario: Scenario, shares: np.ndarray, policy: str) -> list[list[int]]:
    """Workers of each model: replicas in proportion to its share of traffic (at least
    one), spread so each worker's summed share is even; `hash` places by a ring."""
    w, m, slots = scenario.workers, scenario.models, scenario.resident
    capacity = w * min(slots, m)
    replicas = np.minimum(np.maximum(1, np.floor(shares * capacity).astype(int)), w)
    # Fill spare slots, most loaded per replica first, while the capacity lasts.
    while replicas.sum() < capacity:
        i = int(np.argmax(np.where(replicas < w, shares / replicas, -1)))
        if replicas[i] >= w:
            break
        replicas[i] += 1
    if policy == "hash":
        return [_ring(model, int(replicas[model]), w) for model in range(m)]
    load = np.zeros(w)
    count = np.zeros(w, dtype=int)
    hosts: list[list[int]] = [[] for _ in range(m)]
    for model in np.argsort(-shares):
        per = shares[model] / replicas[model]
        for _ in range(replicas[model]):
            free = [i for i in range(w) if count[i] < slots and i not in hosts[model]]
            if not free:
                free = [i for i in range(w) if i not in hosts[model]]
            best = min(free, key=lambda i: (load[i], i))
            hosts[model].append(best)
            load[best] += per
            count[best] += 1
    return hosts


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def _ring(model: int, replicas: int, workers: int) -> list[int]:
    """The first `replicas` distinct workers clockwise of the model's point on a ring of
    64 virtual points per worker."""
    points = sorted((_hash(f"w{w}#{v}"), w) for w in range(workers) for v in range(64))
    key = _hash(f"model{model}")
    start = next((i for i, (p, _) in enumerate(points) if p >= key), 0)
    chosen: list[int] = []
    for i in range(len(points)):
        w = points[(start + i) % len(points)][1]
        if w not in chosen:
            chosen.append(w)
            if len(chosen) == replicas:
                break
    return chosen


class Cluster:
    """One simulated run of a policy at one offered rate."""

    def __init__(self, scenario: Scenario, policy: str, seed: int = 0) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}")
        self.s = scenario
        self.policy = policy
        self.rng = np.random.default_rng(seed)
        ranks = np.arange(1, scenario.models + 1, dtype=float)
        self.shares = ranks**-scenario.zipf_s / np.sum(ranks**-scenario.zipf_s)
        self.hosts = placement(scenario, self.shares, policy)
        self.now = 0.0
        self.events: list[tuple[float, int, Callable, tuple]] = []
        self.seq = 0
        self.workers = [_Worker(i, scenario, self.clock) for i in range(scenario.workers)]
        for model, hosts in enumerate(self.hosts):
            for w in hosts:
                self.workers[w].host(model, scenario.profile, self.clock)
        self.queues: list[deque[_Request]] = [deque() for _ in range(scenario.models)]
        self.pullers: list[deque[int]] = [deque() for _ in range(scenario.models)]
        self.outstanding = np.zeros(scenario.workers, dtype=int)
        self.turn = [0] * scenario.models
        self.router_free = 0.0
        self.latencies: list[tuple[float, float]] = []
        """(arrived, seconds) of each answered request."""

    # Event loop ------------------------------------------------------------------------

    def clock(self) -> float:
        return self.now

    def at(self, when: float, action: Callable, *args: object) -> None:
        self.seq += 1
        heapq.heappush(self.events, (when, self.seq, action, args))

    def run(self, until: float) -> None:
        while self.events and self.events[0][0] <= until:
            when, _, action, args = heapq.heappop(self.events)
            self.now = when
            action(*args)

    # Arrivals --------------------------------------------------------------------------

    def offer(self, rate: float, seconds: float) -> int:
        """Schedule `rate` requests/s for `seconds`; returns how many."""
        count = max(1, round(rate * seconds))
        if self.s.arrivals == "even":
            times = np.arange(count) / rate
        else:
            times = np.cumsum(self.rng.exponential(1 / rate, count))
        models = self.rng.choice(self.s.models, size=count, p=self.shares)
        low, high = self.s.texts
        sizes = self.rng.integers(low, high + 1, size=count)
        passage = self.rng.random(count) < self.s.passage_share
        for t, model, size, long in zip(times, models, sizes, passage, strict=True):
            pool = self.s.passage_lengths if long else self.s.short_lengths
            lengths = [int(pool[i]) for i in self.rng.integers(0, len(pool), size=size)]
            self.at(float(t), self.arrive, _Request(float(t), int(model), lengths))
        return count

    def arrive(self, request: _Request) -> None:
        if self.policy == "pull":
            self.at(self.now + self.s.queue.publish_s, self.published, request)
            return
        # One router process: requests wait their turn for it.
        self.router_free = max(self.now, self.router_free) + self.s.router_s
        worker = self.route(request)
        request.worker = worker
        self.outstanding[worker] += 1
        self.at(self.router_free + self.s.queue.reply_s, self.delivered, worker, request)

    def route(self, request: _Request) -> int:
        hosts = self.hosts[request.model]
        if self.policy == "round-robin" or len(hosts) == 1:
            self.turn[request.model] += 1
            return hosts[self.turn[request.model] % len(hosts)]
        if self.policy == "least-outstanding":
            return min(hosts, key=lambda w: (self.outstanding[w], self.rng.random()))
        if self.policy == "power-of-two":
            a, b = self.rng.choice(hosts, size=2, replace=False)
            return int(a if self.outstanding[a] <= self.outstanding[b] else b)
        return hosts[int(self.rng.integers(len(hosts)))]  # hash: a request id's hash is uniform

    # Pull ------------------------------------------------------------------------------

    def room(self, worker: _Worker, model: int) -> bool:
        """The worker's own rule (EncoderSchedule.room): live work only."""
        return worker.schedule.room(_name(model), False, worker.held, 0) > 0

    def published(self, request: _Request) -> None:
        pullers = self.pullers[request.model]
        if pullers:
            wid = pullers.popleft()
            worker = self.workers[wid]
            worker.waiting.discard(request.model)
            worker.held += 1  # arrives after half a fetch
            self.at(self.now + self.s.queue.fetch_s / 2, self.delivered, wid, request)
            self.want(worker, request.model)
        else:
            self.queues[request.model].append(request)

    def want(self, worker: _Worker, model: int) -> None:
        """Pull for `model` if the worker has room: what is queued now, else wait."""
        if model in worker.waiting:
            return
        if not self.room(worker, model):
            return
        queue = self.queues[model]
        if queue:
            # One fetch: what is queued, while it fits (64 items at most, as Shoal asks).
            for _ in range(64):
                request = queue.popleft()
                worker.held += 1
                self.at(self.now + self.s.queue.fetch_s, self.delivered, worker.id, request)
                if not queue or not self.room(worker, model):
                    break
        else:
            worker.waiting.add(model)
            self.pullers[model].append(worker.id)

    def arm_pulls(self, worker: _Worker) -> None:
        """As the worker does after a pass starts or ends (EncoderSchedule.pull_delay): pull
        now, or withdraw the pulls waiting until the pass is about to end. (A real fetch
        waiting on a busy worker lasts until it expires, within a second; here it is
        withdrawn at once.)"""
        delay = worker.schedule.pull_delay()
        if delay == 0.0:
            for model in worker.hosted:
                self.want(worker, model)
            return
        for waited in worker.waiting:
            self.pullers[waited].remove(worker.id)
        worker.waiting.clear()
        if delay is not None:  # else at the pass's end, an event
            self.at(self.now + delay, self.arm_pulls, worker)

    # Worker ----------------------------------------------------------------------------

    def delivered(self, wid: int, request: _Request) -> None:
        worker = self.workers[wid]
        request.worker = wid
        if self.policy != "pull":
            worker.held += 1
        worker.schedule.live_arrived()
        worker.batcher(request.model).add(request.units)
        self.kick(worker)

    def kick(self, worker: _Worker) -> None:
        """Start what the worker's schedule says is due; else wake when it will be."""
        while True:
            run = worker.schedule.next()
            if isinstance(run, Run):
                self.start(worker, run)
                continue
            if run is not None and (worker.timer is None or worker.timer > run):
                worker.timer = run
                self.at(run, self.timer, worker)
            return

    def start(self, worker: _Worker, run: Run) -> None:
        batch = run.model.batchers[run.key].take(run.share)
        longest = max(u.cost for u in batch)
        seconds = self.s.curve.seconds(len(batch), longest)
        worker.passes += 1
        token = worker.passes
        worker.schedule.started(token, run, len(batch) * longest)
        worker.busy_s += seconds
        worker.rows.append(len(batch))
        self.at(self.now + seconds, self.forwarded, worker, run, token, batch, seconds)
        if self.policy == "pull":
            self.arm_pulls(worker)  # taking inputs out of the pool makes room

    def timer(self, worker: _Worker) -> None:
        if worker.timer is not None and worker.timer <= self.now:
            worker.timer = None
            self.kick(worker)

    def forwarded(
        self, worker: _Worker, run: Run, token: int, batch: list[_Unit], seconds: float
    ) -> None:
        run.model.note_forward(seconds, len(batch) * max(u.cost for u in batch))
        worker.schedule.computed(token, run.mode)
        worker.schedule.ended(run.mode)  # its answers go at once
        for unit in batch:
            request = unit.request
            request.left -= 1
            if request.left == 0:
                worker.held -= 1
                done = self.now + self.s.queue.reply_s + self.s.overhead_s
                if self.policy != "pull":
                    self.outstanding[worker.id] -= 1
                    done += self.s.queue.reply_s  # back through the router
                self.latencies.append((request.arrived, done - request.arrived))
        if self.policy == "pull":
            self.arm_pulls(worker)
        self.kick(worker)


def run_step(
    scenario: Scenario, policy: str, rate: float, seconds: float, seed: int = 0
) -> StepResult:
    """One open-loop step, measured as perf's knee finder measures a real one: requests
    answered, the window they came back in, p50/p90/p99, kept up or not."""
    cluster = Cluster(scenario, policy, seed)
    mean_texts = sum(scenario.texts) / 2
    sent = cluster.offer(rate, seconds)
    for worker in cluster.workers:
        for model in worker.hosted:
            if policy == "pull":
                cluster.want(worker, model)
    cluster.run(seconds + REQUEST_TIMEOUT)
    answered = sorted(lat for _, lat in cluster.latencies if lat <= REQUEST_TIMEOUT)
    step = Step(offered_rps=rate, offered_tps=rate * mean_texts, sent=sent, ok=len(answered))
    step.errors = sent - len(answered)
    if answered:
        last = max(a + lat for a, lat in cluster.latencies if lat <= REQUEST_TIMEOUT)
        elapsed = max(seconds, last - answered[0])
        step.achieved_rps = len(answered) / elapsed
        step.achieved_tps = step.achieved_rps * mean_texts
        step.p50_ms, step.p90_ms, step.p99_ms = (
            quantile(answered, q) * 1000  # type: ignore[operator]
            for q in (0.5, 0.9, 0.99)
        )
    busy = sum(min(w.busy_s, seconds) for w in cluster.workers)
    rows = [r for w in cluster.workers for r in w.rows]
    share = busy / (seconds * scenario.workers)
    return StepResult(step, share, float(np.mean(rows)) if rows else 0.0)


def capacity_guess(scenario: Scenario) -> float:
    """Requests/s the workers could do at full batches, every one busy: an upper bound
    to start the knee search from."""
    mean_texts = sum(scenario.texts) / 2
    short = float(np.mean(scenario.short_lengths))
    passage = float(np.mean(scenario.passage_lengths))
    per_text = (1 - scenario.passage_share) * short + scenario.passage_share * passage
    rows = scenario.profile.max_batch_items
    batch = scenario.curve.seconds(rows, int(per_text))
    return scenario.workers * rows / batch / mean_texts


def find_knee(
    scenario: Scenario,
    policy: str,
    p99_bound: float,
    seconds: float,
    tolerance: float = 0.03,
    seed: int = 0,
) -> tuple[float, StepResult | None]:
    """The highest offered requests/s whose step keeps up (bisection to `tolerance`), and
    that step."""
    low, high, best = 0.0, capacity_guess(scenario) * 1.5, None
    while high - low > tolerance * high:
        rate = (low + high) / 2
        result = run_step(scenario, policy, rate, seconds, seed)
        if kept_up(result.step, p99_bound):
            low, best = rate, result
        else:
            high = rate
    return low, best
