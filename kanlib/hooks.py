"""DDP communication hooks: how a run's gradient buckets are communicated, timed, and (optionally)
slowed down by an emulated inter-node link.

:func:`register` installs what ``cfg.comm_hook`` asks for on a DDP module and returns a
:class:`CommStats` (None for DDP's built-in all-reduce and for the no-op hook, which nothing times):

- ``timed``: all-reduce (average) each bucket;
- ``bf16`` / ``fp16``: all-reduce a compressed copy (bucket / N cast to the 16-bit type), then
  decompress into the bucket (torch's ``default_hooks`` compression, timed here);
- ``powersgd``: torch's ``powerSGD_hook`` with rank ``cfg.powersgd_rank``, compressing from step
  :data:`POWERSGD_START_ITER` on (the earliest torch allows with error feedback and warm start);
- ``noop``: no network at all (``debugging_hooks.noop_hook``), for exposed communication.

Every collective runs on the bucket's own tensors, so on the bucket's device (CUDA tensors on
NCCL, CPU tensors on gloo).

**Timing.** Each bucket's communication is an interval from the hook's call (before compression)
to the completion of what DDP waits for (after decompression): CUDA events on GPU, the host clock
on CPU. Buckets queue behind each other, so a step's communication time is the *union* of its
buckets' intervals (:func:`union_length`), not their sum (k buckets ready together would otherwise
count about k(k+1)/2 transfer times).

**Emulated link** (``cfg.emulated_link``: ``nnodes > 1`` and ``emulate_latency_s`` or
``emulate_bandwidth_bytes_per_s`` set). After a bucket's real all-reduce(s) complete, its completion
is delayed by what a ring all-reduce of each message costs on a link of per-message latency ``L``
and bandwidth ``B`` (:func:`emulated_allreduce_s`)::

    2 (N - 1) L  +  2 (N - 1) / N * bytes / B          (B = 0: no bandwidth term)

``L`` and ``B`` are the performance model's inter-node ``alpha`` and ``1 / beta``
(kanlib.commmodel), so fitting measurements of an emulated link recovers them. The link is serial,
like one network port: a bucket's delay starts when its real all-reduce is done *and* the previous
bucket's delay is over, so the union of intervals grows by the injected seconds. The delay does
not block the autograd thread, so backward keeps computing while a bucket is "on the wire":

- CPU/gloo: a per-process link thread completes the future DDP waits for at the emulated time
  (the gloo thread that finished the real all-reduce is released at once);
- CUDA/NCCL: a ``torch.cuda._sleep`` spin kernel on a dedicated link stream, which waits for the
  all-reduce and which the stream DDP waits on in turn waits for; the spin is calibrated against CUDA
  events once per process. Not run on a GPU yet (no GPU here): the CUDA branch is unverified.

The injected seconds are accounted per step (:meth:`CommStats.end_step`), so a test can check that
a 2x1 placement's communication grows by exactly that much while 1x2's (no emulation) does not.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

POWERSGD_START_ITER = 2
"""First step PowerSGD compresses. torch's PowerSGDState refuses < 2 with error feedback or warm start,
because DDP rebuilds its buckets after the first iteration (their shapes may change)."""
POWERSGD_MIN_COMPRESSION_RATE = 2.0
"""torch's default: a gradient matrix is compressed only if that saves at least this factor."""


def emulated_allreduce_s(n_bytes, world_size: int, latency_s: float, bandwidth_bytes_per_s: float):
    """Seconds a ring all-reduce of ``n_bytes`` over ``world_size`` ranks costs on the emulated link:
    ``2 (N-1) L + 2 (N-1)/N * n_bytes / B`` (no bandwidth term when ``B == 0``; 0 when ``N == 1``).

    n_bytes: message size in bytes (scalar or array); latency_s: L in s; bandwidth_bytes_per_s: B in
    bytes/s. This is kanlib.commmodel's ring formula with ``alpha = L`` and ``beta = 1 / B``.
    """
    n = world_size
    steps = 2 * (n - 1)
    t = steps * latency_s
    if bandwidth_bytes_per_s > 0:
        t = t + steps / n * n_bytes / bandwidth_bytes_per_s
    return t


@dataclass(frozen=True)
class EmulatedLink:
    """A link of per-message latency ``latency_s`` (s) and bandwidth ``bandwidth_bytes_per_s``
    (bytes/s, 0 = unlimited) between ``world_size`` ranks."""

    latency_s: float
    bandwidth_bytes_per_s: float
    world_size: int

    def cost_s(self, messages: list[int]) -> float:
        """Seconds the messages (bytes of each all-reduce a bucket issues) cost on this link."""
        return float(sum(emulated_allreduce_s(m, self.world_size, self.latency_s, self.bandwidth_bytes_per_s)
                         for m in messages))


SPIN_S = 0.002
"""The last seconds of an emulated delay are waited by polling, not sleeping: on a loaded machine a
sleeping process wakes up a millisecond or two late (measured here: a 10 ms sleep took 11.7 ms, median)."""


def sleep_until(deadline: float, spin_s: float = SPIN_S) -> None:
    """Wait until ``time.perf_counter() >= deadline``: sleep until ``spin_s`` before it, then poll, giving the
    CPU away on every poll (``os.sched_yield``, which also releases the GIL), so this process's other threads
    (gloo's, which finish sending what a peer waits for) run at once on a pinned rank's one CPU."""
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return
        if left > spin_s:
            time.sleep(left - spin_s)
        else:
            os.sched_yield()


class _LinkThread:
    """Completes futures at given host times, one after another: the CPU side of a serial link.

    :meth:`deliver` is called from gloo's threads; the due times it receives never decrease (each
    one is computed from the previous one under a lock), so one FIFO worker keeps them in order.
    """

    def __init__(self):
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._free_at = 0.0  # host time the link finishes its last accepted message
        self._thread = threading.Thread(target=self._run, name="kanlib-emulated-link", daemon=True)
        self._thread.start()

    def deliver(self, cost_s: float, fut: torch.futures.Future, value, on_delivered) -> None:
        """Complete ``fut`` with ``value`` ``cost_s`` after now, or after the previous message is
        through; ``on_delivered()`` runs just before (it records the bucket's end time)."""
        with self._lock:
            due = max(time.perf_counter(), self._free_at) + cost_s
            self._free_at = due
            self._q.put((due, fut, value, on_delivered))

    def close(self, timeout_s: float = 10.0) -> None:
        """End the thread once it has delivered what it holds (a worker group's next run makes its own), and
        wait for it: no future of the run completes, and no callback of its DDP reducer runs, after the run
        has released its process group."""
        self._q.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            due, fut, value, on_delivered = item
            sleep_until(due)
            on_delivered()
            fut.set_result(value)


class CommStats:
    """Per-step timing of a DDP module's bucket communication (hook state).

    :meth:`end_step` returns the step's communication time (the union of its bucket intervals) and the
    seconds an emulated link added, and resets. After each complete step: ``n_buckets``,
    ``bucket_bytes`` (DDP's bucket sizes in launch order), ``wire_bytes`` (bytes all-reduced for each
    bucket: smaller than ``bucket_bytes`` under compression) and ``messages_per_bucket``
    (all-reduces per bucket: 3 for a PowerSGD-compressed bucket).
    """

    def __init__(self, device: torch.device, process_group=None, link: EmulatedLink | None = None):
        self.device = device
        self.process_group = process_group
        self.link = link
        self._host: list[tuple[float, float]] = []  # (start, end) host seconds, CPU path
        self._events: list[tuple] = []  # (start, end) CUDA events
        self._bytes: list[int] = []
        self._wire: list[int] = []
        self._messages: list[int] = []
        self._emulated = 0.0  # seconds the emulated link added this step
        self.n_buckets = 0
        self.bucket_bytes: list[int] = []
        self.wire_bytes: list[int] = []
        self.messages_per_bucket: list[int] = []
        self.powersgd = None  # comm_hook=powersgd: the hook and its torch PowerSGDState
        self._link_thread = None
        self._link_stream = None
        self._comm_stream = None
        self._cycles_per_s = None
        self._tail = None  # the future of the last bucket sent through the emulated link
        if link is not None:
            if device.type == "cuda":
                self._link_stream = torch.cuda.Stream(device)
                self._comm_stream = torch.cuda.Stream(device)
                self._cycles_per_s = spin_cycles_per_s(device)
            else:
                self._link_thread = _LinkThread()

    @property
    def world_size(self) -> int:
        return dist.get_world_size(self.process_group or dist.group.WORLD)

    def close(self) -> None:
        """Release the emulated link's thread (the run is over)."""
        if self._link_thread is not None:
            self._link_thread.close()
            self._link_thread = None

    def end_step(self) -> tuple[float, float]:
        """``(in_flight_s, emulated_s)`` of the step: the union of its bucket communication intervals,
        and the delay the emulated link added to them (0 without emulation); resets the step."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            if self._events:
                ref = self._events[0][0]
                spans = [(ref.elapsed_time(s) / 1e3, ref.elapsed_time(e) / 1e3) for s, e in self._events]
            else:
                spans = []
        else:
            spans = self._host
        total = union_length(spans)
        if self._bytes:
            self.n_buckets, self.bucket_bytes = len(self._bytes), list(self._bytes)
            self.wire_bytes, self.messages_per_bucket = list(self._wire), list(self._messages)
        self._host, self._events, self._bytes, self._wire, self._messages = [], [], [], [], []
        emulated, self._emulated = self._emulated, 0.0
        return total, emulated


def union_length(spans) -> float:
    """Total length covered by the intervals ``spans`` (``(start, end)`` pairs), overlaps counted once."""
    total, cur_start, cur_end = 0.0, None, None
    for s, e in sorted(spans):
        if cur_end is None or s > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = s, e
        else:
            cur_end = max(cur_end, e)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def spin_cycles_per_s(device: torch.device) -> float:
    """GPU clock cycles per second of ``torch.cuda._sleep`` on ``device``, measured with CUDA events
    (the second of two runs: the first may include a lazy module load)."""
    cycles = 10_000_000
    rate = 0.0
    for _ in range(2):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.cuda._sleep(cycles)
        b.record()
        b.synchronize()
        rate = cycles / (a.elapsed_time(b) / 1e3)
    return rate


# -- what each hook sends ----------------------------------------------------------------------------
def _group(state: CommStats):
    return state.process_group or dist.group.WORLD


def _allreduce(state: CommStats, bucket) -> tuple[torch.futures.Future, list[int]]:
    """Average the bucket by all-reduce; the future's value is the bucket's buffer."""
    group = _group(state)
    tensor = bucket.buffer().div_(dist.get_world_size(group))
    fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0]), [tensor.numel() * tensor.element_size()]


def _compressed(dtype: torch.dtype):
    def launch(state: CommStats, bucket) -> tuple[torch.futures.Future, list[int]]:
        """All-reduce ``bucket / N`` cast to ``dtype``; decompress into the bucket's buffer in place."""
        group = _group(state)
        buffer = bucket.buffer()
        # divide before the sum, as torch's compression hooks do: fp16 would overflow otherwise
        compressed = buffer.to(dtype).div_(dist.get_world_size(group))
        fut = dist.all_reduce(compressed, group=group, async_op=True).get_future()

        def decompress(f):
            buffer.copy_(f.value()[0])
            return buffer

        return fut.then(decompress), [compressed.numel() * compressed.element_size()]

    return launch


def powersgd_messages(gradient_shapes, element_size: int, rank: int, compressing: bool,
                      min_compression_rate: float = POWERSGD_MIN_COMPRESSION_RATE) -> list[int]:
    """Bytes of each all-reduce torch's ``powerSGD_hook`` issues for one bucket.

    Before compression starts: one all-reduce of the whole bucket. Once compressing: the
    uncompressed gradients (those where rank-``r`` factors would not save ``min_compression_rate``),
    then the P factors (``n x r`` per ``n x m`` gradient matrix), then the Q factors (``m x r``),
    following torch's ``_should_compress`` (a gradient of shape ``(n, ...)`` is an ``n x m`` matrix;
    ``r = min(n, m, rank)``). gradient_shapes: the bucket's gradients' shapes; element_size: bytes.
    """
    total = sum(_numel(s) for s in gradient_shapes)
    if not compressing:
        return [total * element_size]
    uncompressed = p = q = 0
    for shape in gradient_shapes:
        n = shape[0] if len(shape) else 1
        m = _numel(shape) // n if n else 0
        r = min(n, m, rank)
        if (n + m) * r * min_compression_rate < n * m:
            p += n * r
            q += m * r
        else:
            uncompressed += n * m
    return [uncompressed * element_size, p * element_size, q * element_size]


def _numel(shape) -> int:
    out = 1
    for d in shape:
        out *= int(d)
    return out


class _PowerSGD:
    """torch's PowerSGD with its state; :meth:`__call__` launches one bucket.

    Buckets are chained: a bucket's PowerSGD starts when the previous bucket's has finished. torch's
    hook launches its P and Q all-reduces from inside future callbacks and waits for them there; on
    gloo those callbacks run on gloo's worker threads, so two buckets in flight at once launch their
    collectives in an order that can differ between ranks (and can occupy every worker thread): the
    run hangs until the collective timeout (seen here with 3 buckets on 2 ranks). Chained, every rank
    issues them in bucket order. On NCCL a future completes when its work is enqueued, so the chain
    starts each bucket at once and changes nothing.
    """

    def __init__(self, process_group, rank: int, seed: int):
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

        self._hook = psgd.powerSGD_hook
        self.state = psgd.PowerSGDState(process_group=process_group, matrix_approximation_rank=rank,
                                        start_powerSGD_iter=POWERSGD_START_ITER,
                                        min_compression_rate=POWERSGD_MIN_COMPRESSION_RATE,
                                        use_error_feedback=True, warm_start=True, random_seed=seed)
        self.rank = rank
        self._tail: torch.futures.Future | None = None  # the previous bucket's result

    def __call__(self, state: CommStats, bucket) -> tuple[torch.futures.Future, list[int]]:
        # read before the hook runs: it advances state.iter on the last bucket of a step
        compressing = self.state.iter >= self.state.start_powerSGD_iter
        buffer = bucket.buffer()
        messages = powersgd_messages([g.shape for g in bucket.gradients()], buffer.element_size(), self.rank,
                                     compressing, self.state.min_compression_rate)
        if buffer.is_cuda:  # NCCL futures complete on enqueue: every rank launches in bucket order anyway
            return self._hook(self.state, bucket), messages
        out = torch.futures.Future()

        def start(_prev=None):
            try:
                fut = self._hook(self.state, bucket)
            except BaseException as e:
                out.set_exception(e)
                return
            fut.add_done_callback(lambda f: _settle(out, f))

        prev, self._tail = self._tail, out
        if prev is None or prev.done():
            start()
        else:
            prev.add_done_callback(start)
        return out, messages


def _settle(out: torch.futures.Future, f: torch.futures.Future) -> None:
    """Complete ``out`` with ``f``'s value or error."""
    try:
        value = f.value()
    except BaseException as e:
        out.set_exception(e)
        return
    out.set_result(value)


# -- timing and the emulated link around any of them ----------------------------------------------------
def _timed(launch):
    """A DDP hook ``(CommStats, bucket) -> Future`` that runs ``launch``, times the bucket and, with an
    emulated link, delays its completion (see the module docstring)."""

    def hook(state: CommStats, bucket):
        if state.link is not None:
            return _through_link(state, bucket, launch)
        buffer = bucket.buffer()
        if state.device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            fut, _ = _launch_and_count(state, bucket, buffer, launch)

            def done(f):
                value = f.value()
                end = torch.cuda.Event(enable_timing=True)
                end.record()  # runs on a stream that waited for the all-reduce
                state._events.append((start, end))
                return value

            return fut.then(done)
        t0 = time.perf_counter()
        fut, _ = _launch_and_count(state, bucket, buffer, launch)

        def done(f):
            value = f.value()
            state._host.append((t0, time.perf_counter()))
            return value

        return fut.then(done)

    return hook


def _launch_and_count(state: CommStats, bucket, buffer, launch) -> tuple[torch.futures.Future, float]:
    """Launch the bucket's all-reduce(s) and account its bytes; returns the future and the emulated
    link's cost of its messages (s; 0 without a link), which is added to the step's emulated seconds."""
    fut, messages = launch(state, bucket)
    state._bytes.append(buffer.numel() * buffer.element_size())
    state._wire.append(int(sum(messages)))
    state._messages.append(len(messages))
    cost = state.link.cost_s(messages) if state.link is not None else 0.0
    state._emulated += cost
    return fut, cost


def _through_link(state: CommStats, bucket, launch):
    """The emulated link: one message at a time. A bucket's real all-reduce starts once it is ready and
    the link has delivered the previous bucket; its completion is then delayed by its link cost. So a
    bucket holds the link for its real transfer plus the emulated time, and the union of the buckets'
    intervals grows by exactly the injected seconds whenever the link is busy."""
    buffer = bucket.buffer()
    if state.device.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        comm = state._comm_stream
        comm.wait_stream(torch.cuda.current_stream(state.device))  # the bucket's gradients are ready
        comm.wait_stream(state._link_stream)  # the link has delivered the previous bucket
        with torch.cuda.stream(comm):  # NCCL's stream waits for this one, not for the compute stream
            fut, cost = _launch_and_count(state, bucket, buffer, launch)

        def done(f):
            value = f.value()
            current = torch.cuda.current_stream(state.device)
            state._link_stream.wait_stream(current)  # after the real all-reduce ...
            with torch.cuda.stream(state._link_stream):
                torch.cuda._sleep(max(1, int(cost * state._cycles_per_s)))  # ... the link's time
            current.wait_stream(state._link_stream)
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            state._events.append((start, end))
            return value

        return fut.then(done)
    t0 = time.perf_counter()
    out = torch.futures.Future()

    def go(_prev=None):  # on the thread that delivered the previous bucket (or here, for the first)
        try:
            fut, cost = _launch_and_count(state, bucket, buffer, launch)
        except BaseException as e:
            out.set_exception(e)
            return

        def arrived(f):  # on gloo's thread: hand the result to the link thread and return at once
            try:
                value = f.value()
            except BaseException as e:  # a failed all-reduce fails the future DDP waits on
                out.set_exception(e)
                return
            state._link_thread.deliver(cost, out, value, lambda: state._host.append((t0, time.perf_counter())))

        fut.add_done_callback(arrived)

    prev, state._tail = state._tail, out
    if prev is None:
        go()
    else:
        prev.add_done_callback(go)  # runs at once when prev is already done
    return out


timed_allreduce_hook = _timed(_allreduce)
"""All-reduce (average) a gradient bucket, timed (state: :class:`CommStats`)."""
bf16_hook = _timed(_compressed(torch.bfloat16))
"""All-reduce a bfloat16 copy of the bucket, timed."""
fp16_hook = _timed(_compressed(torch.float16))
"""All-reduce a float16 copy of the bucket, timed."""


def register(ddp, cfg, device: torch.device) -> CommStats | None:
    """Install ``cfg.comm_hook`` on ``ddp``; returns the hook's :class:`CommStats` (None when untimed).

    With ``cfg.emulated_link`` the timed hooks also delay each bucket as the emulated inter-node link
    would (module docstring).
    """
    if cfg.comm_hook == "default":
        return None
    if cfg.comm_hook == "noop":
        from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook

        ddp.register_comm_hook(None, noop_hook)
        return None
    link = None
    if getattr(cfg, "emulated_link", False):
        link = EmulatedLink(cfg.emulate_latency_s, cfg.emulate_bandwidth_bytes_per_s, dist.get_world_size())
    stats = CommStats(device, link=link)
    if cfg.comm_hook == "timed":
        hook = timed_allreduce_hook
    elif cfg.comm_hook == "bf16":
        hook = bf16_hook
    elif cfg.comm_hook == "fp16":
        hook = fp16_hook
    elif cfg.comm_hook == "powersgd":
        stats.powersgd = _PowerSGD(None, cfg.powersgd_rank, cfg.seed)
        hook = _timed(stats.powersgd)
    else:
        raise ValueError(f"comm_hook: unknown value {cfg.comm_hook!r}; choose one of default, noop, timed, "
                         f"bf16, fp16, powersgd")
    ddp.register_comm_hook(stats, hook)
    return stats
