#!/usr/bin/env bash
# Start a real single-host Slurm (Debian's slurm-wlm + munge: slurmctld and slurmd on this host,
# one partition of this one node) for the Slurm runner's test (tests/bisect/test_bisect_runners_slurm.py,
# marked `slurm`). Idempotent: when the daemons run with the configuration written here and the
# node is up, it does nothing; a changed configuration restarts them.
# No systemd and no cgroups are assumed (CI containers): processes are tracked by
# proctrack/linuxproc, nothing is accounted, jobs run as the user who submits them.
set -euo pipefail

log() { printf '[start-slurm] %s\n' "$*"; }

node_up() { sinfo -h -N -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; }

need_pkgs=()
command -v slurmctld >/dev/null 2>&1 || need_pkgs+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || need_pkgs+=(munge)
if ((${#need_pkgs[@]})); then
    log "installing ${need_pkgs[*]} from the Debian archive"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${need_pkgs[@]}"
fi

# munge: the key the package made (made here when it did not), the daemon as its own user.
if [[ ! -s /etc/munge/munge.key ]]; then
    log "creating /etc/munge/munge.key"
    mungekey --create --force
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
fi
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    log "starting munged"
    runuser -u munge -- /usr/sbin/munged
fi

# slurm.conf for this host. The node claims more CPUs than a small CI machine has
# (config_overrides): the cluster scripts ask for what a real node gives (e.g. 4 CPUs per task),
# and on a 2-core runner such a job would otherwise pend forever (reason PartitionConfig).
host=$(hostname -s)
memory=$(slurmd -C | head -n 1 | grep -o 'RealMemory=[0-9]*')
node_line="NodeName=$host CPUs=16 $memory"
spool=/var/spool/slurm
mkdir -p "$spool/ctld" "$spool/d" /var/log/slurm /etc/slurm
conf=$(mktemp)
cat >"$conf" <<CONF
# Written by .ci/start-slurm.sh: a one-node cluster on $host for tests.
ClusterName=mics-ci
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$spool/ctld
SlurmdSpoolDir=$spool/d
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
$node_line State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
# No cgroup.conf: slurmd 22.05 loads its cgroup plugin anyway (autodetect; "disabled" is 23.x).
if cmp -s "$conf" /etc/slurm/slurm.conf && node_up && pgrep -x slurmd >/dev/null && pgrep -x slurmctld >/dev/null; then
    rm -f "$conf"
    log "Slurm already runs with this configuration and its node is up; nothing to do"
    exit 0
fi
slurm_running() { pgrep -x slurmctld >/dev/null || pgrep -x slurmd >/dev/null; }
if ! cmp -s "$conf" /etc/slurm/slurm.conf && slurm_running; then
    log "configuration changed: restarting slurmctld and slurmd"
    pkill -x slurmd || true
    pkill -x slurmctld || true
    for _ in $(seq 1 30); do slurm_running || break; sleep 1; done
fi
mv "$conf" /etc/slurm/slurm.conf
chmod 0644 /etc/slurm/slurm.conf

pgrep -x slurmctld >/dev/null 2>&1 || { log "starting slurmctld (log: /var/log/slurm/slurmctld.log)"; slurmctld; }
pgrep -x slurmd >/dev/null 2>&1 || { log "starting slurmd (log: /var/log/slurm/slurmd.log)"; slurmd; }

for _ in $(seq 1 60); do
    if node_up; then
        log "Slurm is up: $(sinfo -h -o '%P %D %T %c CPUs')"
        exit 0
    fi
    # A node left down by an earlier run of this script comes back here.
    scontrol update NodeName="$host" State=RESUME >/dev/null 2>&1 || true
    sleep 1
done
log "Slurm did not come up within 60 s; last lines of its logs:"
tail -n 20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log >&2 || true
exit 1
