#!/usr/bin/env bash
# Bring up a two-node Slurm cluster on this host, for the multi-node tests:
#
#   sudo .ci/slurm-two-nodes-up.sh   # idempotent: returns at once when the cluster already answers
#   export SLURM_CONF=/etc/slurm-two-nodes/slurm.conf   # then sbatch, srun, scontrol talk to it
#
# Two slurmd daemons on this one host (Slurm's multiple-slurmd: `slurmd -N <node>`, each node with its own
# port, spool and pid file), nodes n1 and n2 with one CPU each, in partition "multi". It is a cluster of its
# own (its own SLURM_CONF, ports and state) beside the one-node cluster of .ci/slurm-up.sh, which other tests
# use: that script rewrites /etc/slurm/slurm.conf and restarts its daemons whenever the file differs, so nodes
# added there would come and go under the tests that run meanwhile. Both share munge.
#
# Each node's address is 127.0.0.1 (NodeAddr); its name is not resolvable, so a job finds a node's address
# with `scontrol show node` (the sbatch script does: orchestrator/backends/slurm_nodes.py).
# Env: SLURM_UP_TIMEOUT_SECONDS (default 90).
set -euo pipefail
# shellcheck source=.ci/slurm-lib.sh
. "$(dirname "$0")/slurm-lib.sh"

TIMEOUT_SECONDS="${SLURM_UP_TIMEOUT_SECONDS:-90}"
PARTITION=multi
NODES="n1 n2"
CONF_DIR=/etc/slurm-two-nodes
STATE_DIR=/var/spool/slurm-two-nodes
LOG_DIR=/var/log/slurm-two-nodes
RUN_DIR=/run/slurm-two-nodes
CTLD_PORT=6917
export SLURM_CONF="$CONF_DIR/slurm.conf"

die() { echo "slurm-two-nodes-up: FAILED: $*" >&2; for f in "$LOG_DIR"/*.log; do [ -f "$f" ] && { echo "--- tail of $f" >&2; tail -n 20 "$f" >&2; }; done; exit 1; }
say() { echo "slurm-two-nodes-up: $*"; }

cluster_works() {
  command -v sinfo >/dev/null 2>&1 || return 1
  [ "$(sinfo -h -p "$PARTITION" -o '%D %T' 2>/dev/null)" = "2 idle" ] || return 1
  timeout 30 srun -p "$PARTITION" -N2 --ntasks-per-node=1 -t 1 true >/dev/null 2>&1
}

[ "$(id -u)" = 0 ] || die "run as root (it installs packages and starts the Slurm daemons)"
if [ -f "$SLURM_CONF" ] && cluster_works; then
  say "already up: $(sinfo -h -p "$PARTITION" -o '%P %N %T')"
  exit 0
fi

slurm_install

HOST="$(hostname -s)"
mkdir -p "$CONF_DIR" "$STATE_DIR" "$LOG_DIR" "$RUN_DIR" /run/munge
for node in $NODES; do mkdir -p "$STATE_DIR/$node"; done
{
cat <<CONF
# written by .ci/slurm-two-nodes-up.sh: two nodes on one host (multiple slurmd), for multi-node tests
ClusterName=twonodes
SlurmctldHost=${HOST}(127.0.0.1)
SlurmctldPort=${CTLD_PORT}
CONF
slurm_common_conf
cat <<CONF
StateSaveLocation=${STATE_DIR}
SlurmdSpoolDir=${STATE_DIR}/%n
SlurmctldPidFile=${RUN_DIR}/slurmctld.pid
SlurmdPidFile=${RUN_DIR}/slurmd-%n.pid
SlurmctldLogFile=${LOG_DIR}/slurmctld.log
SlurmdLogFile=${LOG_DIR}/slurmd-%n.log
NodeName=n1 NodeHostname=${HOST} NodeAddr=127.0.0.1 Port=6921 CPUs=1 RealMemory=4000 State=UNKNOWN
NodeName=n2 NodeHostname=${HOST} NodeAddr=127.0.0.1 Port=6922 CPUs=1 RealMemory=4000 State=UNKNOWN
PartitionName=${PARTITION} Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
CONF
} > "$SLURM_CONF.new"
config_changed=1
if [ -f "$SLURM_CONF" ] && cmp -s "$SLURM_CONF" "$SLURM_CONF.new"; then config_changed=0; fi
mv "$SLURM_CONF.new" "$SLURM_CONF"

# munge: shared with the one-node cluster (the same key; started once)
munge_up

if [ "$config_changed" = 1 ]; then
  for pidfile in "$RUN_DIR"/slurmd-*.pid "$RUN_DIR"/slurmctld.pid; do
    if pid_alive "$pidfile"; then kill "$(cat "$pidfile")"; sleep 1; fi
  done
fi
pid_alive "$RUN_DIR/slurmctld.pid" || { say "starting slurmctld"; slurmctld -f "$SLURM_CONF" || die "slurmctld did not start"; }
for node in $NODES; do
  pid_alive "$RUN_DIR/slurmd-$node.pid" || { say "starting slurmd -N $node"; slurmd -f "$SLURM_CONF" -N "$node" || die "slurmd -N $node did not start"; }
done

deadline=$(( $(date +%s) + TIMEOUT_SECONDS ))
state=""
while [ "$(date +%s)" -lt "$deadline" ]; do
  state="$(sinfo -h -p "$PARTITION" -o '%D %T' 2>/dev/null | tr '\n' ' ' | sed 's/ $//' || true)"
  [ "$state" = "2 idle" ] && break
  case "$state" in *down*|*drain*) scontrol update NodeName=n1,n2 State=RESUME >/dev/null 2>&1 || true ;; esac
  sleep 1
done
[ "$state" = "2 idle" ] || die "partition $PARTITION is '${state:-absent}' after ${TIMEOUT_SECONDS}s, not two idle nodes"
out="$(timeout 60 srun -p "$PARTITION" -N2 --ntasks-per-node=1 -t 1 bash -c 'echo "$SLURMD_NODENAME:$SLURM_NODEID"' 2>&1 | sort | tr '\n' ' ')" \
  || die "a two-node srun failed: $out"
say "up: SLURM_CONF=$SLURM_CONF, partition $PARTITION, nodes n1 n2 on $HOST; srun -N2 -> $out"
