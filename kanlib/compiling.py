"""torch.compile for the KAN kernels: running a kernel compiled or saying why not, and paying the set-up early.

:func:`run_compiled` compiles a kernel once per layer shape with static shapes (``fullgraph=True``, so a graph
break or dynamo's recompile limit raises and that call runs eagerly, recorded as "fast"); where torch.compile
cannot run (no C++ compiler, unsupported platform, compile error) it raises :class:`CompileUnavailable`, the
device type stays marked broken (:func:`compile_failure`) and the layer falls back to the eager kernels, with
one warning per process.

Compiling once: torch 2.13 keeps compiled kernels on disk by default (FX graph cache
``TORCHINDUCTOR_FX_GRAPH_CACHE`` and AOTAutograd cache ``TORCHINDUCTOR_AUTOGRAD_CACHE``, both on) under
``TORCHINDUCTOR_CACHE_DIR`` (default ``/tmp/torchinductor_<user>``): a second process with the same folder
loads instead of compiling. What it still pays per process is inductor's import, dynamo's tracing of each
kernel and shape, and the CPU vector-ISA probe; :func:`remember_isa_probes` makes the probe once per host,
:func:`prepare_compile` starts the rest in the background. :func:`compile_paths_without_spaces` lets inductor's
C++ builds run from folders whose paths have whitespace.

The kernels themselves are in :mod:`kanlib.pointwise`; which one a layer calls, in :mod:`kanlib.fast_kan`.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import warnings

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

class CompileUnavailable(RuntimeError):
    """torch.compile cannot run a kernel here (recorded per device type; the layer runs eagerly)."""


_COMPILED: dict = {}  # kernel -> its torch.compile wrapper (one per kernel: dynamo caches per shape/device)
_BROKEN: dict = {}  # device type -> why torch.compile failed there; that device's kernels run eagerly
_WARNED: set = set()


def compile_failure(device_type: str) -> str | None:
    """Why torch.compile failed on ``device_type`` in this process, or ``None`` if it has not failed."""
    return _BROKEN.get(device_type)


def _warn_once(key, msg: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(msg, RuntimeWarning, stacklevel=4)


def _alias_without_spaces(target: str, kind: str) -> str | None:
    """A whitespace-free symbolic link to ``target`` in a private folder of the temporary directory (made
    atomically, so that the ranks of a launch may race), or None where that folder's own path has whitespace."""
    import hashlib
    import tempfile

    base = os.path.join(tempfile.gettempdir(), f"kanlib-paths-{os.getuid() if hasattr(os, 'getuid') else 0}")
    if any(c.isspace() for c in base):
        return None
    link = os.path.join(base, f"{kind}-{hashlib.sha1(target.encode()).hexdigest()[:12]}")
    if os.path.islink(link) and os.path.realpath(link) == os.path.realpath(target):
        return link
    os.makedirs(base, mode=0o700, exist_ok=True)
    tmp = f"{link}.{os.getpid()}.{threading.get_ident()}"
    os.symlink(target, tmp)
    os.replace(tmp, link)
    return link


def compile_paths_without_spaces() -> dict:
    """Let inductor's C++ builds run where a path it passes to the compiler has whitespace.

    torch (2.13) writes the CPU compiler's command line as one string and splits it on whitespace, its own
    include and library folders and the output file unquoted: with torch installed under a folder whose path
    has a space (a checkout in ``~/My Projects``, a virtual environment inside it) or an inductor cache folder
    with one, every CPU compile fails ("C++ compile error") and the KAN layers run the eager fast path; a
    default study in such a clone ran every run on ``fast``. This points inductor at whitespace-free symbolic
    links to those folders (``<tmp>/kanlib-paths-<uid>/``; same files, same cache). Returns what it aliased
    (``{"torch": link, "cache": link}``, empty where nothing had whitespace); idempotent; a failure leaves
    things as they were, for the first compile to report."""
    done = {}
    try:
        import torch.utils.cpp_extension as cpp_extension
        from torch._inductor import cpp_builder
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        torch_dir = getattr(cpp_extension, "_TORCH_PATH", "")
        if any(c.isspace() for c in torch_dir):
            link = _alias_without_spaces(torch_dir, "torch")
            if link:
                cpp_extension._TORCH_PATH = link
                cpp_extension.TORCH_LIB_PATH = os.path.join(link, "lib")
                if hasattr(cpp_builder, "_TORCH_PATH"):
                    cpp_builder._TORCH_PATH = link
                    cpp_builder._LINKER_SCRIPT = os.path.join(link, "_inductor", "script.ld")
                done["torch"] = link
        cache = cache_dir()  # creates it, and fixes TORCHINDUCTOR_CACHE_DIR to its absolute path
        if any(c.isspace() for c in cache):
            link = _alias_without_spaces(cache, "inductor-cache")
            if link:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = link
                done["cache"] = link
    except Exception:  # noqa: BLE001 - the first compile reports the real problem
        pass
    return done


_PREPARING: dict = {}


def prepare_compile(device_type: str = "cpu", background: bool = True) -> None:
    """Pay torch.compile's per-process set-up now, in a background thread by default.

    Every fresh process that compiles (even with a warm inductor cache) first imports inductor
    (~0.9 s here) and, for CPU kernels, probes the vector ISAs by compiling and loading small
    libraries in subprocesses (~1.3 s here, mostly waiting). A launcher that calls this at start-up
    overlaps that with its rendezvous and data loading, so that the first compiled step only traces
    and loads cached kernels. Idempotent; errors are left for the first real compile to report.
    Call it before forking worker processes, not while they start.
    """
    if device_type in _PREPARING:
        return

    def work():
        try:
            import torch._inductor.compile_fx  # noqa: F401
            compile_paths_without_spaces()
            if device_type == "cpu":
                remember_isa_probes()
                from torch._inductor.cpu_vec_isa import pick_vec_isa

                pick_vec_isa()
        except Exception:  # noqa: BLE001 - the first compile reports the real problem
            pass

    if background:
        thread = threading.Thread(target=work, name="kanlib-prepare-compile", daemon=True)
        _PREPARING[device_type] = thread
        thread.start()
    else:
        _PREPARING[device_type] = None
        work()


def wait_prepared() -> None:
    """Wait for :func:`prepare_compile`'s background imports to end.

    Call it before this thread imports torch._dynamo or torch._inductor itself: two threads importing
    the same circle of modules at once deadlock on Python's module locks (``_DeadlockError``), which is
    what a run did when it read dynamo's compile time while the thread was still importing inductor.
    """
    for thread in list(_PREPARING.values()):
        if thread is not None and thread is not threading.current_thread():
            thread.join()


ISA_PROBES_NAME = "kanlib-vec-isa-probes.json"


def remember_isa_probes() -> None:
    """Make inductor's CPU vector-ISA probe a one-time cost per host, not per process.

    Before its first CPU kernel every process checks each vector ISA the CPU has (AVX-512, AVX2) by
    building a tiny library (cached on disk) and then loading it in a child Python, one child per ISA:
    about 1.3 s here, paid by every run of a sweep. This wraps that load probe so that a success is
    remembered in ``<inductor cache dir>/kanlib-vec-isa-probes.json``, keyed by host, torch, Python and
    the library's path (which encodes the ISA flags and the compiler), and later processes of the same
    key skip the child. A failure is never remembered (it is probed again), inductor's settings and
    therefore its cache keys are unchanged, and where torch has no such probe this does nothing.
    """
    try:
        from torch._inductor import cpu_vec_isa
        from torch._inductor.runtime.cache_dir_utils import cache_dir
    except ImportError:
        return
    original = getattr(cpu_vec_isa.VecISA, "_probe_load", None)
    if original is None or getattr(original, "kanlib_remembers", False):
        return
    store = os.path.join(cache_dir(), ISA_PROBES_NAME)
    prefix = f"{socket.gethostname()}|{torch.__version__}|{sys.executable}|"

    def probe_load(self, output_path: str) -> bool:
        key = prefix + output_path
        try:
            with open(store) as f:
                known = json.load(f)
        except (OSError, ValueError):
            known = {}
        if known.get(key) is True and os.path.isfile(output_path):
            return True
        ok = original(self, output_path)
        if ok:
            known[key] = True
            tmp = f"{store}.{os.getpid()}.{threading.get_ident()}.tmp"
            try:
                os.makedirs(os.path.dirname(store), exist_ok=True)
                with open(tmp, "w") as f:
                    json.dump(known, f)
                os.replace(tmp, store)  # concurrent writers: the last wins, a lost key is probed again
            except OSError:
                pass
        return ok

    probe_load.kanlib_remembers = True
    cpu_vec_isa.VecISA._probe_load = probe_load


def run_compiled(fn, *args):
    """``torch.compile(fn)(*args)``; raises :class:`CompileUnavailable` where it cannot run.

    A compile error (no C++ compiler, unsupported platform, inductor bug) marks the device type broken
    for the rest of the process, with one warning. Past dynamo's recompile limit (each kernel compiles
    once per shape, static shapes: about 8% faster than dynamic ones here) only that call runs eagerly.
    """
    device_type = next(a for a in args if isinstance(a, torch.Tensor)).device.type
    if device_type in _BROKEN:
        raise CompileUnavailable(_BROKEN[device_type])
    try:
        if fn not in _COMPILED:
            compile_paths_without_spaces()
            if device_type == "cpu":
                remember_isa_probes()
            # fullgraph: a graph break would leave part of the kernel eager without telling anyone, and
            # it makes the recompile limit raise instead of silently running eagerly.
            _COMPILED[fn] = torch.compile(fn, dynamic=False, fullgraph=True)
        return _outside_ddp(_COMPILED[fn], args)
    except Exception as e:  # noqa: BLE001 - any failure of the compiler means "run eagerly"
        reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:200]
        if type(e).__name__ == "FailOnRecompileLimitHit":
            _warn_once(("limit", fn.__name__), f"kanlib: torch.compile recompile limit reached for "
                       f"{fn.__name__}; new shapes of it run eagerly (raise torch._dynamo.config.recompile_limit)")
            raise CompileUnavailable(reason) from e
        _BROKEN[device_type] = reason
        _warn_once(device_type, f"kanlib: torch.compile unavailable on {device_type} ({reason}); "
                   f"KAN layers there run the eager fast path")
        raise CompileUnavailable(reason) from e


def _outside_ddp(compiled, args):
    """``compiled(*args)`` with no DDP module marked active.

    Inside a DDP forward dynamo hands every frame it compiles to its DDPOptimizer, which splits a model's graph
    at DDP's bucket boundaries and refuses a bucket cap below DDP's first bucket (1 MiB): a kernel first
    compiled in a run with ``bucket_cap_mb=0.01`` failed ("First bucket should be smaller/equal to other
    buckets"), and compiling stayed off for every later run of that worker group. These kernels hold no
    parameters, so there is nothing to split; DDP's own marker is restored at once (a class attribute)."""
    active = getattr(DDP, "_active_ddp_module", None)
    if active is None:
        return compiled(*args)
    DDP._active_ddp_module = None
    try:
        return compiled(*args)
    finally:
        DDP._active_ddp_module = active


def compiled_or_eager(paths: set, fn, *args):
    """``fn(*args)`` compiled where possible, else eagerly (same values); records which one ran."""
    try:
        out = run_compiled(fn, *args)
        paths.add("compiled")
        return out
    except CompileUnavailable:
        paths.add("fast")
        return fn(*args)

