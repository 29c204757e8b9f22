#!/usr/bin/env bash
# Bring up a one-node Slurm cluster on this host, for CI and local tests.
#
#   sudo .ci/slurm-up.sh        # idempotent: returns at once when the cluster already answers
#
# 1. install slurm-wlm and munge (apt) when missing
# 2. write /etc/slurm/slurm.conf: one node (this host, its real CPUs and memory), one partition
# 3. start munged, slurmctld and slurmd as root, without systemd (containers have none)
# 4. wait until the node is idle and a trivial job runs; exit non-zero with the reason if not
#
# Env: SLURM_UP_TIMEOUT_SECONDS (default 90), SLURM_PARTITION (default "debug").
# Besides the default partition, two more on the same node, "spot" and "ondemand", so a job can be moved from
# one to the other (run.deadline with backend.partition=spot backend.on_demand_partition=ondemand).
set -euo pipefail
# shellcheck source=.ci/slurm-lib.sh
. "$(dirname "$0")/slurm-lib.sh"

TIMEOUT_SECONDS="${SLURM_UP_TIMEOUT_SECONDS:-90}"
PARTITION="${SLURM_PARTITION:-debug}"
EXTRA_PARTITIONS="spot ondemand"
CONF_DIR=/etc/slurm
LOG_DIR=/var/log/slurm

die() { echo "slurm-up: FAILED: $*" >&2; for f in "$LOG_DIR"/slurmctld.log "$LOG_DIR"/slurmd.log; do [ -f "$f" ] && { echo "--- tail of $f" >&2; tail -n 20 "$f" >&2; }; done; exit 1; }
say() { echo "slurm-up: $*"; }

cluster_works() {
  command -v sinfo >/dev/null 2>&1 || return 1
  sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)' || return 1
  local p; for p in $PARTITION $EXTRA_PARTITIONS; do sinfo -h -p "$p" -o '%P' 2>/dev/null | grep -q . || return 1; done
  timeout 30 srun -N1 -n1 -t 1 hostname >/dev/null 2>&1
}

[ "$(id -u)" = 0 ] || die "run as root (it installs packages and starts the Slurm daemons)"

if cluster_works; then
  say "already up: $(sinfo -h -o '%P %N %T' | head -n 1)"
  exit 0
fi

# 1. packages
slurm_install

# 2. config: this host, as slurmd itself measures it
HOST="$(hostname -s)"
NODE_LINE="$(slurmd -C | grep '^NodeName=' | sed 's/ UpTime=.*//')" || die "slurmd -C could not describe this host"
[ -n "$NODE_LINE" ] || die "slurmd -C printed no NodeName line"
mkdir -p "$CONF_DIR" "$LOG_DIR" /var/spool/slurmctld /var/spool/slurmd /run/munge
{
cat <<CONF
# written by .ci/slurm-up.sh: a one-node cluster for tests
ClusterName=ci
SlurmctldHost=${HOST}(127.0.0.1)
CONF
slurm_common_conf
cat <<CONF
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=${LOG_DIR}/slurmctld.log
SlurmdLogFile=${LOG_DIR}/slurmd.log
${NODE_LINE} NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=${PARTITION} Nodes=${HOST} Default=YES MaxTime=INFINITE State=UP
CONF
} > "$CONF_DIR/slurm.conf.new"
for p in $EXTRA_PARTITIONS; do
  echo "PartitionName=${p} Nodes=${HOST} Default=NO MaxTime=INFINITE State=UP" >> "$CONF_DIR/slurm.conf.new"
done
config_changed=1
if [ -f "$CONF_DIR/slurm.conf" ] && cmp -s "$CONF_DIR/slurm.conf" "$CONF_DIR/slurm.conf.new"; then config_changed=0; fi
mv "$CONF_DIR/slurm.conf.new" "$CONF_DIR/slurm.conf"

# 3. daemons
munge_up

if [ "$config_changed" = 1 ]; then
  # a stale daemon would keep the old node description
  for pidfile in /run/slurmd.pid /run/slurmctld.pid; do
    if pid_alive "$pidfile"; then kill "$(cat "$pidfile")"; sleep 1; fi
  done
fi
pid_alive /run/slurmctld.pid || { say "starting slurmctld"; slurmctld || die "slurmctld did not start"; }
pid_alive /run/slurmd.pid || { say "starting slurmd"; slurmd || die "slurmd did not start"; }

# 4. wait for an idle node, then prove a job runs
deadline=$(( $(date +%s) + TIMEOUT_SECONDS ))
state=""
while [ "$(date +%s)" -lt "$deadline" ]; do
  state="$(sinfo -h -n "$HOST" -o '%T' 2>/dev/null | head -n 1 || true)"
  case "$state" in
    idle|mixed|allocated) break ;;
    down*|drain*|drng*) scontrol update NodeName="$HOST" State=RESUME >/dev/null 2>&1 || true ;;
  esac
  sleep 1
done
case "$state" in idle|mixed|allocated) ;; *) die "node $HOST is '${state:-absent}' after ${TIMEOUT_SECONDS}s, not idle";; esac
out="$(timeout 60 srun -N1 -n1 -t 1 hostname 2>&1)" || die "srun hostname failed: $out"
say "up: partitions $PARTITION (default) $EXTRA_PARTITIONS, node $HOST ($NODE_LINE); srun hostname -> $out"
