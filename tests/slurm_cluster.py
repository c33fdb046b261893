"""A real SLURM on this machine for the tests: munged, slurmctld and two slurmd on localhost.

Both nodes (``n1``, ``n2``) are this host (``NodeAddr=127.0.0.1``), told apart by their slurmd
port; each has ``CPUs=1`` so two single-process jobs do not oversubscribe a 2-core machine.
Every daemon runs in the foreground as a child of this process, with its files in one
temporary folder (its own munge key and socket too, so a system munged is left alone), and
``stop()`` ends exactly those processes by PID. See shared notes/slurm.md for what was tried.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time

REQUIRED = ("slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo", "munged", "mungekey")
INSTALL_SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              ".ci", "install-slurm.sh")

SLURM_CONF = """\
# Written by tests/slurm_cluster.py: two nodes on localhost, no accounting, no cgroups.
ClusterName=kanlibtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
# Finished jobs leave the controller after 4 s (the default 300 s delays sbatch --wait).
MinJobAge=4
ReturnToService=2
{nodes}
PartitionName=debug Nodes={node_names} Default=YES MaxTime=INFINITE State=UP
"""


def missing_binaries() -> list[str]:
    """The SLURM and munge programs not found on PATH (sbin included)."""
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin"
    return [b for b in REQUIRED if shutil.which(b, path=path) is None]


def ensure_installed() -> str | None:
    """Install SLURM and munge with .ci/install-slurm.sh when missing.

    Returns None when everything is there, else a sentence saying why it cannot be (no root,
    no apt-get, the install failed) for the caller to skip or fail with.
    """
    if not missing_binaries():
        return None
    if os.geteuid() != 0:
        return f"SLURM programs missing ({', '.join(missing_binaries())}) and not root to install them"
    if shutil.which("apt-get") is None:
        return f"SLURM programs missing ({', '.join(missing_binaries())}) and apt-get is unavailable"
    proc = subprocess.run(["bash", INSTALL_SCRIPT], capture_output=True, text=True)
    if proc.returncode != 0 or missing_binaries():
        return (f"{INSTALL_SCRIPT} failed (exit {proc.returncode}); still missing "
                f"{', '.join(missing_binaries()) or 'nothing'}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return None


def _sbin(name: str) -> str:
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin"
    found = shutil.which(name, path=path)
    if found is None:
        raise FileNotFoundError(f"{name} not found on PATH or in /usr/sbin")
    return found


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


class LocalSlurm:
    """munged + slurmctld + ``len(nodes)`` slurmd on localhost, all children of this process.

    ``env`` holds ``SLURM_CONF`` for the clients (sbatch, scontrol, sinfo, srun in a job).
    """

    def __init__(self, root: str | None = None, *, ctld_port: int = 6817,
                 node_ports: tuple[int, ...] = (6818, 6819), cpus_per_node: int = 1):
        self.root = root or tempfile.mkdtemp(prefix="kanlib-slurm-")
        self.ctld_port, self.node_ports, self.cpus = ctld_port, node_ports, cpus_per_node
        self.nodes = [f"n{i + 1}" for i in range(len(node_ports))]
        self.conf = os.path.join(self.root, "slurm.conf")
        self.munge_socket = os.path.join(self.root, "munge", "munge.socket")
        self.procs: dict[str, subprocess.Popen] = {}
        self.env = dict(os.environ, SLURM_CONF=self.conf)

    # -- set-up -----------------------------------------------------------------------
    def start(self, timeout_s: float = 30.0) -> "LocalSlurm":
        """Start the daemons and wait until every node is idle; on failure stop and raise."""
        if os.geteuid() != 0:
            raise RuntimeError("LocalSlurm needs root (slurmd runs jobs as their submitting user)")
        busy = [p for p in (self.ctld_port, *self.node_ports) if not _port_free(p)]
        if busy:
            raise RuntimeError(f"ports {busy} are in use: another slurmctld/slurmd running? "
                               f"(pick other ctld_port/node_ports)")
        try:
            self._write_files()
            self._start_munge()
            self._spawn("slurmctld", [_sbin("slurmctld"), "-D", "-c", "-f", self.conf])
            for node in self.nodes:
                self._spawn(f"slurmd-{node}", [_sbin("slurmd"), "-D", "-N", node, "-f", self.conf])
            self._wait_idle(timeout_s)
        except BaseException:
            self.stop(check=False)
            raise
        return self

    def _write_files(self) -> None:
        os.chmod(self.root, 0o755)  # the munge user must reach its socket folder
        for d in ("state", "spool", "munge"):
            os.makedirs(os.path.join(self.root, d), exist_ok=True)
        host = socket.gethostname()
        nodes = "\n".join(
            f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={p} CPUs={self.cpus} State=UNKNOWN"
            for n, p in zip(self.nodes, self.node_ports))
        with open(self.conf, "w") as f:
            f.write(SLURM_CONF.format(host=host, ctld_port=self.ctld_port, root=self.root,
                                      munge_socket=self.munge_socket, nodes=nodes,
                                      node_names=",".join(self.nodes)))

    def _start_munge(self) -> None:
        mdir = os.path.join(self.root, "munge")
        key = os.path.join(mdir, "munge.key")
        subprocess.run([_sbin("mungekey"), "--create", "--keyfile", key], check=True,
                       capture_output=True, text=True)
        user = pwd.getpwnam("munge")
        for p in (mdir, key):
            os.chown(p, user.pw_uid, user.pw_gid)
        os.chmod(mdir, 0o755)  # munged wants its socket folder searchable by all
        os.chmod(key, 0o600)
        self._spawn("munged", [_sbin("munged"), "-F",
                               f"--socket={self.munge_socket}", f"--key-file={key}",
                               f"--pid-file={mdir}/munged.pid", f"--log-file={mdir}/munged.log",
                               f"--seed-file={mdir}/munged.seed"], user="munge")
        deadline = time.monotonic() + 10
        while not os.path.exists(self.munge_socket):
            if self.procs["munged"].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"munged did not create {self.munge_socket}:\n{self.log_tail('munged')}")
            time.sleep(0.05)

    def _spawn(self, name: str, cmd: list[str], user: str | None = None) -> None:
        out = open(os.path.join(self.root, f"{name}.out"), "w")
        if user:
            os.chown(out.name, pwd.getpwnam(user).pw_uid, -1)
        ids = {"user": user, "group": pwd.getpwnam(user).pw_gid, "extra_groups": []} if user else {}
        self.procs[name] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                            start_new_session=True, **ids)
        out.close()

    def _wait_idle(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        states = ""
        while time.monotonic() < deadline:
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{dead} exited during start-up:\n" +
                                   "\n".join(self.log_tail(n) for n in dead))
            proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env,
                                  capture_output=True, text=True)
            states = proc.stdout.strip() + proc.stderr.strip()
            idle = {ln.split()[0] for ln in proc.stdout.splitlines() if ln.split()[1:] == ["idle"]}
            if idle >= set(self.nodes):
                return
            time.sleep(0.2)
        raise RuntimeError(f"nodes not idle after {timeout_s} s; sinfo says: {states!r}\n" +
                           "\n".join(self.log_tail(n) for n in self.procs))

    # -- inspection -------------------------------------------------------------------
    def log_tail(self, name: str, lines: int = 20) -> str:
        """The last lines of a daemon's output (``munged``, ``slurmctld``, ``slurmd-n1``...)."""
        path = os.path.join(self.root, f"{name}.out")
        extra = {"slurmctld": "slurmctld.log", "munged": "munge/munged.log"}.get(
            name, f"{name}.log" if name.startswith("slurmd-") else "")
        text = ""
        for p in (path, os.path.join(self.root, extra) if extra else ""):
            if p and os.path.exists(p):
                with open(p, errors="replace") as f:
                    text += f.read()
        return f"--- {name} ---\n" + "\n".join(text.splitlines()[-lines:])

    def alive(self) -> list[int]:
        """PIDs of live (non-zombie) processes of this cluster: the daemons started here and any
        process whose command line names our folder or whose environment holds our SLURM_CONF
        (slurmstepd, job steps, torchrun and its workers)."""
        pids = {p.pid for p in self.procs.values() if p.poll() is None}
        mark = f"SLURM_CONF={self.conf}".encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                        continue
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read()
                with open(f"/proc/{entry}/environ", "rb") as f:
                    environ = f.read().split(b"\0")
            except OSError:  # exited meanwhile, or not ours to read
                continue
            if self.root.encode() in cmdline or mark in environ:
                pids.add(int(entry))
        return sorted(pids)

    # -- tear-down --------------------------------------------------------------------
    def _cancel_jobs(self, timeout_s: float = 10.0) -> None:
        """scancel every job still queued or running and wait until none is left."""
        if self.procs.get("slurmctld") is None or self.procs["slurmctld"].poll() is not None:
            return
        subprocess.run(["scancel", "--full", "--user=root"], env=self.env, capture_output=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            q = subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env, capture_output=True, text=True)
            if q.returncode != 0 or not q.stdout.strip():
                return
            time.sleep(0.2)

    def stop(self, check: bool = True, remove: bool = True) -> None:
        """SIGTERM slurmd, then slurmctld, then munged (SIGKILL after 5 s), by PID.

        With ``check``, raise if any process of this cluster is still alive afterwards.
        """
        self._cancel_jobs()
        order = [n for n in self.procs if n.startswith("slurmd-")] + ["slurmctld", "munged"]
        for name in order:
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                continue
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        for pid in self.alive():  # job processes slurmd left behind: ours by SLURM_CONF
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        left = self.alive()
        if remove and not left:
            shutil.rmtree(self.root, ignore_errors=True)
        if check and left:
            raise RuntimeError(f"processes of the test SLURM still alive after stop(): {left} "
                               f"(folder {self.root} kept)")
