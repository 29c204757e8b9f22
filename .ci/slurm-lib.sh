# Shared by .ci/slurm-up.sh (one node) and .ci/slurm-two-nodes-up.sh (two nodes): sourced, not run.
# Each caller defines die() and say() first.

# slurm-wlm and munge from apt, when a daemon is missing
slurm_install() {
  if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
    say "installing slurm-wlm and munge"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q slurm-wlm munge >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null && apt-get install -y -q slurm-wlm munge >/dev/null; } \
      || die "apt-get install slurm-wlm munge did not succeed"
  fi
}

# the slurm.conf lines every test cluster here shares: root daemons, no cgroups, no accounting, requeue on
slurm_common_conf() {
  cat <<CONF
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobRequeue=1
ReturnToService=2
MpiDefault=none
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
KillWait=30
SlurmctldTimeout=30
SlurmdTimeout=30
CONF
}

# a munge key, and munged running (one for every cluster on this host)
munge_up() {
  if [ ! -s /etc/munge/munge.key ]; then
    say "creating a munge key"
    mkdir -p /etc/munge
    if command -v mungekey >/dev/null; then mungekey --create --force >/dev/null; else dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 2>/dev/null; fi
  fi
  chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
  chmod 0700 /etc/munge && chmod 0400 /etc/munge/munge.key
  if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    say "starting munged"
    runuser -u munge -- /usr/sbin/munged || die "munged did not start (see /var/log/munge/munged.log)"
    sleep 1
    munge -n | unmunge >/dev/null 2>&1 || die "munge cannot encode and decode a credential"
  fi
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
