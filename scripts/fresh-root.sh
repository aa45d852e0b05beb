#!/usr/bin/env bash
# Runs luapipe's test command on a fresh minimal Debian root, as a new user's machine has it.
#
#   scripts/fresh-root.sh [COMMAND...]      (default: scripts/test.sh; run as root)
#
# Makes (once, then reuses) a pristine bookworm root with debootstrap --variant=minbase plus git,
# unpacks a new copy of it for every run, clones this repository's committed HEAD into it and runs
# COMMAND there with a bare environment (env -i, as root, no LANG, TERM=dumb), so nothing installed
# by hand on this machine can leak into the run: only what scripts/install-deps.sh installs.
#
# When the package mirror cannot be reached, prints that and exits 0 without running anything
# (CI's rule: the fresh-root part is skipped only then). Any other failure exits non-zero.
#
# Environment: LUAPIPE_FRESH_ROOT_DIR (work folder, default /var/tmp/luapipe-fresh-root),
# LUAPIPE_FRESH_ROOT_MAX_AGE_DAYS (remake the pristine root when older, default 7).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${LUAPIPE_FRESH_ROOT_DIR:-/var/tmp/luapipe-fresh-root}
max_age=${LUAPIPE_FRESH_ROOT_MAX_AGE_DAYS:-7}
suite=bookworm
[ $# -gt 0 ] || set -- scripts/test.sh

say() { echo "fresh-root: $*"; }
if [ "$(id -u)" -ne 0 ]; then
  say "must run as root (it uses debootstrap, chroot and bind mounts)" >&2
  exit 2
fi

# The mirror this machine's apt uses (deb822 or one-line sources), else Debian's default.
mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
if [ -z "$mirror" ]; then
  mirror=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
fi
mirror=${mirror:-http://deb.debian.org/debian}

mirror_reachable() {
  local url=$mirror/dists/$suite/Release
  if command -v curl >/dev/null; then
    curl -fsS -o /dev/null --max-time 30 -r 0-0 "$url" 2>/dev/null
  elif command -v wget >/dev/null; then
    wget -q -O /dev/null --timeout=30 "$url"
  else
    # bash's own TCP: an HTTP HEAD on port 80 (the mirrors these machines use are http)
    local hp=${mirror#*://}; hp=${hp%%/*}; local path=/${mirror#*://*/}
    timeout 30 bash -c "exec 3<>/dev/tcp/$hp/80 && printf 'HEAD %s/dists/$suite/Release HTTP/1.0\r\nHost: %s\r\n\r\n' '$path' '$hp' >&3 && head -1 <&3 | grep -q ' 200 '" 2>/dev/null
  fi
}
if ! mirror_reachable; then
  say "the package mirror $mirror cannot be reached; skipping the fresh-root run"
  exit 0
fi

mkdir -p "$work"
base=$work/base-$suite.tar
if [ -f "$base" ] && [ -n "$(find "$base" -mtime +"$max_age" 2>/dev/null)" ]; then
  say "pristine root older than $max_age days; making it again"
  rm -f "$base"
fi
if [ ! -f "$base" ]; then
  if ! command -v debootstrap >/dev/null; then
    say "installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  fi
  tmp=$work/base.tmp
  rm -rf "$tmp"
  say "making a minimal $suite root with debootstrap (a few minutes; log $work/debootstrap.log)"
  if ! debootstrap --variant=minbase "$suite" "$tmp" "$mirror" >"$work/debootstrap.log" 2>&1; then
    say "debootstrap failed; the end of its log:" >&2
    tail -5 "$work/debootstrap.log" >&2
    exit 1
  fi
  # apt inside the root reads the same sources as this machine (same mirror, same security suite)
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    mkdir -p "$tmp/etc/apt/sources.list.d"
    cp /etc/apt/sources.list.d/debian.sources "$tmp/etc/apt/sources.list.d/"
    rm -f "$tmp/etc/apt/sources.list"
  fi
  cp /etc/resolv.conf "$tmp/etc/resolv.conf" 2>/dev/null || true
  chroot "$tmp" apt-get update -qq >"$work/base-apt.log" 2>&1
  chroot "$tmp" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq git ca-certificates \
    >>"$work/base-apt.log" 2>&1
  tar -C "$tmp" -cf "$base.part" . && mv "$base.part" "$base"
  rm -rf "$tmp"
fi

root=$work/root.$$
# everything mounted at or below the root (what the run mounts itself too, such as
# /run/netns of `ip netns add`), innermost first
unmount_all() {
  local m
  awk -v r="$root" '$2 == r || index($2, r "/") == 1 {print $2}' /proc/self/mounts | sort -r |
    while read -r m; do umount -l "$m" 2>/dev/null || true; done
}
cleanup() { unmount_all; rm -rf --one-file-system "$root"; }
trap cleanup EXIT
mkdir -p "$root"
tar -C "$root" -xf "$base"
# the root is a mount point of its own (as / is on a real machine: `unshare -m`, `ip netns exec`
# remount it), private so that nothing mounted inside shows on this machine
mount --bind "$root" "$root"
mount --make-private "$root"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
for m in proc sys dev dev/pts dev/shm; do
  mkdir -p "$root/$m"
  mount --bind "/$m" "$root/$m"
done

# the committed HEAD, as a clone gets it (uncommitted changes are not part of the test)
mkdir -p "$root/home/user"
git clone -q "$repo" "$root/home/user/luapipe"
say "running '$*' on a fresh $suite root ($(git -C "$repo" rev-parse --short HEAD))"
t0=$(date +%s)
set +e
chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  bash -c 'cd /home/user/luapipe && "$@"' fresh-root "$@"
rc=$?
set -e
say "'$*' exited $rc after $(($(date +%s) - t0)) s"
exit $rc
