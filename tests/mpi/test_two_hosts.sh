#!/usr/bin/env bash
# test_two_hosts.sh LUAPIPE — what a user who outgrows one machine does
# first, on two emulated hosts (run from the repo root): two network
# namespaces joined by a veth pair (addresses of a private /24 that only
# these namespaces hold), each with its own /tmp (a private mount of a
# per-host directory: nothing shared there), 2 ranks on each, Open MPI over
# TCP only (btl tcp,self; its daemon on the second host started through a
# launcher that enters that namespace). MoE at pp = 2 x ep = 2 with EPLB:
# 6 steps unbroken, 2 steps with a checkpoint, then a new job resumed for
# steps 3..6, losses and final parameters bitwise the unbroken run's
# (checkpoint_check.lua): once with the checkpoints in a directory both
# hosts see (a cluster's shared file system), once under each host's
# private /tmp (one path, two directories: each host its own disk), where
# each host's copy must hold only its own ranks' files (and rank 0's host
# the markers and state.json); in both, what a killed save left (planted
# before the resume, on either host) must be gone after it, and with
# private disks a rank file missing on host b is named; then
# examples/train_moe.lua with --trace: the measured trace, gathered on
# rank 0 over the comm, holds compute slices of all 4 ranks. Ends every
# namespace and process it made. Exits 77 (skipped) when not root, without
# mpirun, ip or unshare, or when namespaces cannot be made.
set -u
luapipe=${1:?usage: test_two_hosts.sh path/to/luapipe}
luapipe=$(cd "$(dirname "$luapipe")" && pwd)/$(basename "$luapipe")
[ "$(id -u)" -eq 0 ] || { echo "skip: needs root (network namespaces)"; exit 77; }
for p in mpirun ip unshare mount; do
  command -v "$p" >/dev/null || { echo "skip: no $p"; exit 77; }
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OPENBLAS_NUM_THREADS=1
id=lp$$
nsa=${id}a nsb=${id}b
net=10.213.$(($$ % 200 + 20))
ipa=$net.1 ipb=$net.2
work=$(mktemp -d /var/tmp/lp2hosts.XXXXXX 2>/dev/null || mktemp -d)
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
cleanup() {
  # whatever still runs inside the namespaces, then the namespaces
  for ns in "$nsa" "$nsb"; do
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
  # `ip netns add` mounts /run/netns when it is not yet: undo that when no namespace is left
  if [ "$netns_mounted" -eq 0 ] && mountpoint -q /run/netns 2>/dev/null &&
    [ -z "$(ip netns list 2>/dev/null)" ]; then
    umount /run/netns 2>/dev/null
  fi
  rm -rf "$work"
}
netns_mounted=0
mountpoint -q /run/netns 2>/dev/null && netns_mounted=1
trap cleanup EXIT
if ! ip netns add "$nsa" 2>/dev/null || ! ip netns add "$nsb" 2>/dev/null; then
  echo "skip: cannot make network namespaces here"
  exit 77
fi
# entering a namespace remounts / (ip netns exec, unshare -m): a chroot whose root is not a
# mount point cannot
if ! ip netns exec "$nsa" unshare -m --propagation private true 2>"$work/probe"; then
  echo "skip: cannot enter a network namespace with a mount namespace here: $(head -1 "$work/probe")"
  exit 77
fi
ip link add "${id}va" type veth peer name "${id}vb" || { echo "skip: no veth pairs"; exit 77; }
ip link set "${id}va" netns "$nsa"
ip link set "${id}vb" netns "$nsb"
ip -n "$nsa" addr add "$ipa/24" dev "${id}va"
ip -n "$nsb" addr add "$ipb/24" dev "${id}vb"
for ns in "$nsa" "$nsb"; do ip -n "$ns" link set lo up; done
ip -n "$nsa" link set "${id}va" up
ip -n "$nsb" link set "${id}vb" up
mkdir -p "$work/hosta" "$work/hostb"
chmod 1777 "$work/hosta" "$work/hostb"

# What the jobs need from under /tmp (the repository and the build, when a clone lives there,
# as CI's does) stays visible on both hosts at its own path: moved aside, the private /tmp
# mounted, then put back.
keep=
for p in "$PWD" "$(dirname "$luapipe")"; do
  case $p in /tmp/*) ;; *) continue ;; esac
  inside=0
  for k in $keep; do case "$p/" in "$k"/*) inside=1 ;; esac; done
  [ "$inside" -eq 1 ] || keep="$keep $p"
done
# enter DIR CMD... (inside a new mount namespace): DIR becomes /tmp, the kept paths stay
cat >"$work/enter" <<EOF
#!/bin/sh
dir=\$1
shift
for p in $keep; do mkdir -p "$work/keep\$p" && mount --bind "\$p" "$work/keep\$p" || exit 1; done
mount --bind "\$dir" /tmp || exit 1
for p in $keep; do mkdir -p "\$p" && mount --bind "$work/keep\$p" "\$p" || exit 1; done
exec "\$@"
EOF
# host NS DIR CMD...: runs CMD in namespace NS with DIR as its /tmp
cat >"$work/host" <<EOF
#!/bin/sh
ns=\$1 dir=\$2
shift 2
exec ip netns exec "\$ns" unshare -m --propagation private "$work/enter" "\$dir" "\$@"
EOF
# Open MPI's launcher for the second host: "agent HOST COMMAND..."
cat >"$work/agent" <<EOF
#!/bin/sh
shift
exec "$work/host" "$nsb" "$work/hostb" sh -c "\$*"
EOF
chmod +x "$work/enter" "$work/host" "$work/agent"

mpi=(timeout -k 5 180 "$work/host" "$nsa" "$work/hosta" mpirun --host "$ipa:2,$ipb:2" -np 4
  --mca plm_rsh_agent "$work/agent" --mca btl tcp,self --mca btl_tcp_if_include "$net.0/24"
  --mca oob_tcp_if_include "$net.0/24" -x OPENBLAS_NUM_THREADS -x OMPI_ALLOW_RUN_AS_ROOT
  -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM -x LUAPIPE_LUA_PATH -x LUAPIPE_TIMEOUT)
export LUAPIPE_TIMEOUT=${LUAPIPE_TIMEOUT:-60}
run() { # what ARGS...: one job; rc in $rc, output in $work/out
  local what=$1
  shift
  "${mpi[@]}" "$@" >"$work/out" 2>&1 </dev/null
  rc=$?
  echo "$what: rc $rc"
}

# the two hosts' /tmp are not shared: a file made on one is not on the other
"$work/host" "$nsa" "$work/hosta" sh -c 'echo a >/tmp/only-a'
"$work/host" "$nsb" "$work/hostb" sh -c '[ ! -e /tmp/only-a ]' || fail "the hosts share /tmp"

# tree DIR: what DIR holds, as sorted relative paths on one line
tree() { (cd "$1" 2>/dev/null && find . -mindepth 1 | sed 's|^\./||' | sort | tr '\n' ' '); }
# checkpoints go to a directory both hosts see (as a cluster's shared file
# system): every rank's file, rank 0's markers and state.json in one place
d=$work/shared/moe
mkdir -p "$d"
run "MoE pp 2 x ep 2 over two hosts, 6 steps" "$luapipe" tests/mpi/checkpoint_check.lua 1f1b:moe2 \
  full "$d" 6
[ "$rc" -eq 0 ] && [ "$(grep -c ': ok full.* eplb 3 plans' "$work/out")" -eq 4 ] ||
  { fail "the unbroken run"; cat "$work/out"; }
run "2 steps with a checkpoint" "$luapipe" tests/mpi/checkpoint_check.lua 1f1b:moe2 part "$d"
[ "$rc" -eq 0 ] || { fail "the checkpointed run"; cat "$work/out"; }
[ "$(ls "$d"/ckpt/step2/rank*.ckpt 2>/dev/null | wc -l)" -eq 4 ] ||
  { fail "the step-2 checkpoint lacks ranks"; ls -R "$d"; }
# what a save of step 3 killed mid-way leaves (pending, a finished and a half-written file)
mkdir -p "$d/ckpt/step3"
printf '{"step": 3, "ranks": 4}\n' >"$d/ckpt/pending"
echo x >"$d/ckpt/step3/rank2.ckpt"
echo x >"$d/ckpt/step3/rank3.ckpt.tmp"
run "resumed for steps 3..6" "$luapipe" tests/mpi/checkpoint_check.lua 1f1b:moe2 resume "$d" 6
if [ "$rc" -ne 0 ] || [ "$(grep -c ': ok resume' "$work/out")" -ne 4 ]; then
  fail "the resumed run differs from the unbroken one"
  cat "$work/out"
else
  grep -m1 ': ok resume' "$work/out"
fi
want="latest step6 step6/rank0.ckpt step6/rank1.ckpt step6/rank2.ckpt step6/rank3.ckpt step6/state.json "
[ "$(tree "$d/ckpt")" = "$want" ] ||
  fail "after the resume the shared checkpoint holds '$(tree "$d/ckpt")', want '$want'"

# checkpoints under each host's private /tmp: /tmp/moe/ckpt is a different directory on
# each host (ranks 0, 1 on host a, 2, 3 on host b). The unbroken run's results above go,
# each rank's, to its host.
ha=$work/hosta/moe hb=$work/hostb/moe
mkdir -p "$ha" "$hb"
cp "$d"/full.rank[01].lua "$ha"/ && cp "$d"/full.rank[23].lua "$hb"/
run "2 steps with a checkpoint on each host's own disk" "$luapipe" tests/mpi/checkpoint_check.lua \
  1f1b:moe2 part /tmp/moe
if [ "$rc" -ne 0 ]; then
  fail "the checkpointed run on private disks"
  cat "$work/out"
else
  want_a="latest step2 step2/rank0.ckpt step2/rank1.ckpt step2/state.json "
  want_b="step2 step2/rank2.ckpt step2/rank3.ckpt "
  [ "$(tree "$ha/ckpt")" = "$want_a" ] ||
    fail "host a's checkpoint holds '$(tree "$ha/ckpt")', want '$want_a'"
  [ "$(tree "$hb/ckpt")" = "$want_b" ] ||
    fail "host b's checkpoint holds '$(tree "$hb/ckpt")', want '$want_b'"
  # what a save of step 3 killed mid-way leaves: pending and rank 0's file on host a, a
  # finished and a half-written rank file on host b, and a half-written step-2 file there
  printf '{"step": 3, "ranks": 4}\n' >"$ha/ckpt/pending"
  mkdir -p "$ha/ckpt/step3" "$hb/ckpt/step3"
  echo x >"$ha/ckpt/step3/rank0.ckpt"
  echo x >"$hb/ckpt/step3/rank2.ckpt"
  echo x >"$hb/ckpt/step3/rank3.ckpt.tmp"
  echo x >"$hb/ckpt/step2/rank3.ckpt.tmp"
  run "resumed for steps 3..6 from each host's own disk" "$luapipe" tests/mpi/checkpoint_check.lua \
    1f1b:moe2 resume /tmp/moe 6
  if [ "$rc" -ne 0 ] || [ "$(grep -c ': ok resume' "$work/out")" -ne 4 ]; then
    fail "the run resumed from private disks differs from the unbroken one"
    cat "$work/out"
  else
    grep -m1 ': ok resume' "$work/out"
  fi
  # step 6 replaced step 2 (and 4) on both hosts; the killed save's leftovers are gone
  want_a="latest step6 step6/rank0.ckpt step6/rank1.ckpt step6/state.json "
  want_b="step6 step6/rank2.ckpt step6/rank3.ckpt "
  [ "$(tree "$ha/ckpt")" = "$want_a" ] ||
    fail "after the resume host a's checkpoint holds '$(tree "$ha/ckpt")', want '$want_a'"
  [ "$(tree "$hb/ckpt")" = "$want_b" ] ||
    fail "after the resume host b's checkpoint holds '$(tree "$hb/ckpt")', want '$want_b'"
  # a rank whose file is not on its host is named, with the file
  rm "$hb/ckpt/step6/rank3.ckpt"
  run "resumed with rank 3's file gone from host b" "$luapipe" tests/mpi/checkpoint_check.lua \
    1f1b:moe2 error /tmp/moe 8
  n=$(grep -c "rank 3: .*/tmp/moe/ckpt/step6/rank3.ckpt" "$work/out")
  if [ "$rc" -ne 0 ] && [ "$n" -eq 1 ]; then
    grep -m1 "rank 3: " "$work/out"
  else
    fail "a missing rank file on host b ($n ranks said it)"
    cat "$work/out"
  fi
fi

# the measured trace, gathered on rank 0 (host a) over the comm
run "train_moe with --trace" "$luapipe" examples/train_moe.lua --schedule dualpipe --pp 2 --ep 2 \
  --microbatches 4 --steps 2 --seed 1 --trace /tmp/moe.json
[ "$rc" -eq 0 ] || { fail "train_moe over two hosts"; cat "$work/out"; }
if [ -f "$work/hosta/moe.json" ]; then
  [ -e "$work/hostb/moe.json" ] && fail "the trace was written on the second host too"
  for r in 0 1 2 3; do
    grep -q "\"pid\":$r,\"tid\":0,\"ts\"" "$work/hosta/moe.json" ||
      fail "the gathered trace has no compute slice of rank $r"
  done
else
  fail "no trace on rank 0's host"
fi

if [ "$fails" -ne 0 ]; then
  echo "test_two_hosts: $fails failure(s)"
  exit 1
fi
echo "test_two_hosts: all passed"
