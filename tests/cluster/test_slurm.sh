#!/usr/bin/env bash
# test_slurm.sh LUAPIPE — a training job under a real Slurm, killed and
# brought back (run from the repo root, as root): starts Debian's munged
# (as the munge user), slurmctld and slurmd with a configuration of its own
# (its own key, ports, state and spool folders in a temporary folder; one
# node offering 4 CPUs), then
#   1. submits examples/slurm/train.sbatch with LUAPIPE_LAUNCHER=mpirun
#      (Open MPI's launcher inside the allocation) and waits: the unbroken
#      run;
#   2. submits it again under srun (PMIx), kills rank 1 with SIGKILL in the
#      middle of the run: the launcher names the rank and ends the others
#      at once (well within the watchdog time), the script's retry loop
#      starts a second attempt that resumes from the newest checkpoint, and
#      the job completes;
#   3. checks every step's loss of the broken job (the last printed for
#      each step) equals the unbroken run's bitwise, and that 4 ranks saw a
#      world of 4 under both launchers.
# It stops every daemon it started and removes what it wrote. Exits 77
# (skipped), saying why, when not root or when the daemons cannot run here.
set -u
luapipe=${1:?usage: $(basename "$0") path/to/luapipe}
luapipe=$(cd "$(dirname "$luapipe")" && pwd)/$(basename "$luapipe")
skip() { echo "skip: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "the Slurm test starts daemons: run it as root"
for c in munged munge slurmctld slurmd sbatch srun scontrol sinfo runuser mpirun; do
  command -v "$c" >/dev/null 2>&1 || [ -x "/usr/sbin/$c" ] || skip "$c is not installed (scripts/install-deps.sh installs it)"
done
PATH=$PATH:/usr/sbin
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
repo=$(pwd)
D=$(mktemp -d /tmp/luapipe-slurm.XXXXXX)
chmod 755 "$D"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
cleanup() {
  for f in "$D/slurmd.pid" "$D/slurmctld.pid" "$D/munge/pid"; do
    [ -s "$f" ] && kill "$(cat "$f")" 2>/dev/null
  done
  sleep 1
  for f in "$D/slurmd.pid" "$D/slurmctld.pid" "$D/munge/pid"; do
    [ -s "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null
  done
  pkill -9 -f "$D/" 2>/dev/null
  rm -rf "$D"
}
trap cleanup EXIT

# munge: its own key and socket, run as the munge user
mkdir -p "$D/munge" "$D/state" "$D/spool" "$D/log" "$D/work"
dd if=/dev/urandom of="$D/munge/key" bs=1024 count=1 status=none
chown -R munge:munge "$D/munge" 2>/dev/null || skip "there is no munge user"
chmod 711 "$D/munge"
chmod 400 "$D/munge/key"
runuser -u munge -- munged --socket="$D/munge/sock" --key-file="$D/munge/key" \
  --pid-file="$D/munge/pid" --log-file="$D/munge/log" --seed-file="$D/munge/seed" \
  || skip "munged cannot start here: $(tail -1 "$D/munge/log" 2>/dev/null)"
munge -S "$D/munge/sock" -n | unmunge -S "$D/munge/sock" >/dev/null \
  || skip "munge does not answer on its socket"

host=$(hostname)
port=$((20000 + RANDOM % 20000))
cat >"$D/slurm.conf" <<CONF
ClusterName=luapipetest
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$D/munge/sock
CredType=cred/munge
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
JobRequeue=1
NodeName=$host CPUs=4 State=UNKNOWN
PartitionName=luapipe Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF=$D/slurm.conf
slurmctld -f "$SLURM_CONF" || skip "slurmctld cannot start here: $(tail -2 "$D/log/slurmctld.log" 2>/dev/null)"
slurmd -f "$SLURM_CONF" || skip "slurmd cannot start here: $(tail -2 "$D/log/slurmd.log" 2>/dev/null)"
for _ in $(seq 60); do
  sinfo -h -o %t 2>/dev/null | grep -q idle && break
  sleep 0.5
done
sinfo -h -o %t 2>/dev/null | grep -q idle || skip "the Slurm node did not come up: $(tail -2 "$D/log/slurmd.log")"
echo "slurm: up ($(sinfo -h -o '%P %D nodes %c CPUs %t'))"

steps=60
opts=(--schedule dualpipe --steps "$steps" --log-every 1 --seed 3)
job_state() { scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
wait_job() { # id, seconds
  local s
  for _ in $(seq $(($2 * 2))); do
    s=$(job_state "$1")
    case $s in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) echo "$s"; return;; esac
    sleep 0.5
  done
  echo "still ${s:-unknown} after $2 s"
}
submit() { # name launcher -> job id
  LUAPIPE=$luapipe LUAPIPE_LAUNCHER=$2 LUAPIPE_CHECKPOINT=$D/work/$1 LUAPIPE_EVERY=10 \
    LUAPIPE_TIMEOUT=20 sbatch --parsable -N 1 -n 4 --chdir="$repo" -J "$1" -o "$D/work/$1.out" \
    examples/slurm/train.sbatch "${opts[@]}"
}
losses() { grep -E '^step [0-9]+ loss' "$1" | awk '{ last[$2] = $4 } END { for (k in last) print k, last[k] }' | sort -n; }

# 1. unbroken, Open MPI's mpirun inside the allocation
id=$(submit unbroken mpirun) || { fail "sbatch refused the job"; exit 1; }
st=$(wait_job "$id" 300)
echo "unbroken job $id (mpirun): $st"
if [ "$st" != COMPLETED ]; then
  fail "the unbroken job ended $st"
  cat "$D/work/unbroken.out"
  tail -20 "$D/log/slurmctld.log"
  exit 1
fi
[ "$(losses "$D/work/unbroken.out" | wc -l)" -eq "$steps" ] || fail "the unbroken job printed $(losses "$D/work/unbroken.out" | wc -l) of $steps steps"

# 2. under srun, rank 1 killed mid-run
id=$(submit broken srun) || { fail "sbatch refused the job"; exit 1; }
killed=
for _ in $(seq 600); do
  case $(job_state "$id") in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL) break;; esac
  n=$(grep -cE '^step [0-9]+ loss' "$D/work/broken.out" 2>/dev/null)
  if [ "${n:-0}" -ge 25 ]; then
    for p in $(pgrep -f "examples/train_char_lm.lua"); do
      env=$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null)
      if grep -qx "SLURM_JOB_ID=$id" <<<"$env" && grep -qx "SLURM_PROCID=1" <<<"$env"; then
        kill -9 "$p" && killed=$p && t_kill=$(date +%s)
      fi
    done
    break
  fi
  sleep 0.2
done
[ -n "$killed" ] || fail "found no rank 1 of job $id to kill"
echo "killed rank 1 (pid $killed) after step $n"
st=$(wait_job "$id" 300)
echo "broken job $id (srun): $st"
out=$D/work/broken.out
[ "$st" = COMPLETED ] || { fail "the broken job ended $st"; cat "$out"; }
grep -q "task 1: Killed" "$out" || fail "the launcher did not name rank 1 as killed"
grep -q "attempt 2 of" "$out" || fail "no second attempt"
grep -q "^resumed from checkpoint $D/work/broken/step[0-9]*" "$out" || fail "the second attempt did not resume from a checkpoint"
t_second=$(date +%s)
grep -c "world of 4\|on 4 ranks" "$D/work/unbroken.out" "$out" >/dev/null || true
if [ "$(losses "$out")" != "$(losses "$D/work/unbroken.out")" ]; then
  fail "the resumed job's losses differ from the unbroken run's"
  diff <(losses "$D/work/unbroken.out") <(losses "$out") | head -20
else
  echo "losses of all $steps steps equal the unbroken run's bitwise"
fi
for f in "$D/work/unbroken.out" "$out"; do
  grep -q "on 4 ranks" "$f" || { fail "$(basename "$f"): the ranks did not see a world of 4"; head -5 "$f"; }
done

if [ "$fails" -ne 0 ]; then
  echo "--- broken job output"; cat "$out"
  echo "test_slurm: $fails failure(s)"
  exit 1
fi
echo "test_slurm: all passed"
