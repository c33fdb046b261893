#!/usr/bin/env bash
# Install SLURM (controller, node daemon, clients) and munge for the @pytest.mark.slurm tests,
# only when they are missing. Debian/Ubuntu, as root. The tests start their own daemons
# (tests/slurm_cluster.py); this script configures and starts nothing.
set -euo pipefail
need=()
for bin in slurmctld slurmd sbatch srun scontrol sinfo munged mungekey; do
    PATH="$PATH:/usr/sbin:/sbin" command -v "$bin" >/dev/null 2>&1 || need+=("$bin")
done
if [ ${#need[@]} -eq 0 ]; then
    echo "install-slurm: slurm and munge already installed"
    exit 0
fi
echo "install-slurm: missing ${need[*]}; installing slurmctld slurmd slurm-client munge"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends slurmctld slurmd slurm-client munge
