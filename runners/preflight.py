"""A look at the machine before a study: is anything else using the CPUs (or GPUs) the study will use?

``python -m runners.preflight OUT`` (``make study`` runs it first) samples, over about a second: the load average,
the processes that used more than 5% of a CPU and where they ran, each CPU's busy and steal share, the CPU
frequency governor and clock where the kernel exposes them, free memory, and the GPUs' other processes where
NVML is available. It prints one screen and keeps it as ``OUT/preflight/<time>.json``. It refuses nothing: a
busy machine is said, and the study's own per-run interference measures (docs/measurement.md) decide which runs
were disturbed.
"""

from __future__ import annotations

import datetime
import glob
import json
import os
import sys
import time

BUSY_SHARE = 0.05  # a process using more than this share of one CPU over the sample is listed
SAMPLE_S = 1.0


def _proc_times() -> dict[int, tuple[str, int, int]]:
    """pid -> (command, utime + stime in ticks, the CPU it last ran on)."""
    out = {}
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat") as f:
                raw = f.read()
            with open(f"/proc/{e}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        name, rest = raw[raw.index("(") + 1:raw.rindex(")")], raw.rsplit(")", 1)[1].split()
        out[int(e)] = (cmd or f"[{name}]", int(rest[11]) + int(rest[12]), int(rest[36]))
    return out


def _cpu_times() -> dict[int, tuple[int, int, int]]:
    """cpu -> (busy, steal, total) jiffies from /proc/stat."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and not line.startswith("cpu "):
                name, *v = line.split()
                v = [int(x) for x in v] + [0] * 8
                out[int(name[3:])] = (v[0] + v[1] + v[2] + v[5] + v[6], v[7], sum(v[:8]))
    return out


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _frequency() -> dict:
    """Per CPU: the cpufreq governor and current clock (MHz), where the kernel exposes cpufreq; else None."""
    out = {}
    for d in sorted(glob.glob("/sys/devices/system/cpu/cpu[0-9]*/cpufreq")):
        cpu = int(d.split("/")[-2][3:])
        cur = _read(os.path.join(d, "scaling_cur_freq"))
        out[cpu] = {"governor": _read(os.path.join(d, "scaling_governor")),
                    "mhz": int(cur) / 1000 if cur and cur.isdigit() else None}
    return out or None


def _memory() -> dict:
    info = {}
    for line in (_read("/proc/meminfo") or "").splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable"):
            info[key] = int(rest.split()[0]) * 1024
    return {"total_bytes": info.get("MemTotal"), "available_bytes": info.get("MemAvailable")}


def _gpus() -> list | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
            out.append({"index": i, "name": str(pynvml.nvmlDeviceGetName(h)), "processes": len(procs),
                        "utilization": int(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)})
        return out
    except Exception:  # noqa: BLE001 - no NVML here: unknown
        return None


def look(sample_s: float = SAMPLE_S) -> dict:
    """What the machine is doing now (see the module docstring)."""
    me = {os.getpid(), os.getppid()}
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    p0, c0, t0 = _proc_times(), _cpu_times(), time.monotonic()
    time.sleep(sample_s)
    p1, c1, t1 = _proc_times(), _cpu_times(), time.monotonic()
    hz = os.sysconf("SC_CLK_TCK")
    busy = []
    for pid, (cmd, ticks, cpu) in p1.items():
        if pid in me or pid not in p0:
            continue
        share = (ticks - p0[pid][1]) / hz / (t1 - t0)
        if share > BUSY_SHARE:
            busy.append({"pid": pid, "cpu_share": round(share, 3), "last_cpu": cpu, "command": cmd[:160]})
    per_cpu = {}
    for c in cpus:
        if c in c0 and c in c1:
            total = max(1, c1[c][2] - c0[c][2])
            per_cpu[c] = {"busy": round((c1[c][0] - c0[c][0]) / total, 3), "steal": round((c1[c][1] - c0[c][1]) / total, 3)}
    load = os.getloadavg() if hasattr(os, "getloadavg") else (None, None, None)
    return {"at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": os.uname().nodename, "cpus": cpus, "load_1m_5m_15m": list(load), "per_cpu": per_cpu,
            "busy_processes": sorted(busy, key=lambda b: -b["cpu_share"]), "frequency": _frequency(),
            "memory": _memory(), "gpus": _gpus(), "sample_s": round(t1 - t0, 3)}


def summary(seen: dict) -> str:
    """One screen of what :func:`look` saw, ending with what it means for the study."""
    lines = [f"pre-flight {seen['at']} on {seen['host']}: {len(seen['cpus'])} CPUs, load "
             + " / ".join(f"{x:.2f}" for x in seen["load_1m_5m_15m"] if x is not None)]
    for c, v in seen["per_cpu"].items():
        lines.append(f"  cpu{c}: {v['busy']:.0%} busy, {v['steal']:.0%} stolen by the hypervisor")
    for b in seen["busy_processes"][:8]:
        lines.append(f"  busy: pid {b['pid']} {b['cpu_share']:.0%} of a CPU (last on cpu{b['last_cpu']}): {b['command']}")
    freq = seen["frequency"]
    lines.append("  CPU frequency: " + ("not exposed by this kernel (no cpufreq)" if not freq else
                                       ", ".join(f"cpu{c} {v['governor']} {v['mhz']} MHz" for c, v in freq.items())))
    mem = seen["memory"]
    if mem["available_bytes"]:
        lines.append(f"  memory: {mem['available_bytes'] / 2 ** 30:.1f} GiB free of {mem['total_bytes'] / 2 ** 30:.1f}")
    if seen["gpus"] is not None:
        for g in seen["gpus"]:
            lines.append(f"  gpu{g['index']} {g['name']}: {g['processes']} processes, {g['utilization']}% busy")
    quiet = not seen["busy_processes"] and all(v["busy"] < 0.1 and v["steal"] < 0.05 for v in seen["per_cpu"].values())
    lines.append("  -> quiet: nothing else is using these CPUs" if quiet else
                 "  -> busy: other processes use these CPUs; runs they disturb are flagged (and run again) by the study")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: python -m runners.preflight OUT (the study's output folder)")
    seen = look()
    print(summary(seen), flush=True)
    folder = os.path.join(argv[0], "preflight")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, seen["at"].replace(":", "").replace("+0000", "Z") + ".json")
    with open(path, "w") as f:
        json.dump(seen, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
