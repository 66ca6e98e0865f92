#!/usr/bin/env bash
# A second, experimental Docker engine for the CRIU snapshot experiment (docs/snapshots.md), beside
# the host's main engine and never touching it: its own data root, exec root, socket, pidfile, its own
# containerd (the daemon starts one under its exec root), no bridge, no iptables, no ip forwarding,
# its containers' cgroups under /corral-criu. Its default runtime is runc with a newer CRIU than
# bookworm's 3.17, which cannot dump on a kernel >= 6.13 ("vdso: Unexpected rt vDSO area bounds", fixed
# in CRIU 4.1): `install-criu` unpacks a newer Debian's criu and the libraries it needs into a private
# root and runs it with that Debian's loader; the host's packages are left as they are.
#
#   bench/criu-engine.sh install-criu   # CRIU 4.2 into $CRIU_ROOT (Debian's mirror, apt's own client)
#   bench/criu-engine.sh up [IMAGE...]  # start the engine, copy the images into it from the main one
#   bench/criu-engine.sh down           # stop it, remove its data root, exec root and socket
#   bench/criu-engine.sh purge          # down, and remove the private CRIU and its downloads
#
# Use it with DOCKER_HOST=unix:///var/run/docker-criu.sock (bench/snapshots.py does).
set -euo pipefail

NAME=docker-criu
DATA=/var/lib/$NAME
EXEC=/var/run/$NAME
SOCK=/var/run/$NAME.sock
PIDFILE=/var/run/$NAME.pid
BRIDGE=corral-criu0  # its own bridge (see up): never --bridge=none
LOG=/var/log/$NAME.log
# Debian's suite to take criu from. sid's 4.2: trixie's 4.1 dumps no TCP or UDP socket on a kernel
# >= 6.16 ("sockets: Can't get 1:16 opt: Operation not supported": SO_PASSCRED is AF_UNIX's and
# AF_NETLINK's alone there since), fixed in 4.2; bookworm's 3.17 no process on a kernel >= 6.13.
CRIU_SUITE=${CRIU_SUITE:-sid}
CRIU_ROOT=${CRIU_ROOT:-/opt/corral-criu-$CRIU_SUITE}
APT_DIR=${APT_DIR:-/var/tmp/corral-criu-apt-$CRIU_SUITE}
# userns-remap (docs/userns.md) by default: CRIU reads every task's rlimits with prlimit(2), which for a
# task of another uid needs CAP_SYS_RESOURCE over the task's user namespace. A root without that
# capability in its bounding set (as on this evaluation's host) has it over a user namespace it owns,
# never over the host's: without remapping the dump fails, "Can't get rlimit 0: Operation not
# permitted". CRIU_USERNS=none runs without it to show that.
CRIU_USERNS=${CRIU_USERNS:-default}
# criu and what it links against, as the suite has them (bookworm's libc is too old for it).
LIBNET=libnet9
[ "$CRIU_SUITE" = trixie ] && LIBNET=libnet1
CRIU_DEBS=(criu libcompel1 libc6 libgnutls30t64 libnftables1 libnl-3-200 libprotobuf-c1 libbsd0 libmd0
  libuuid1 $LIBNET libp11-kit0 libidn2-0 libunistring5 libtasn1-6 libnettle8t64 libhogweed6t64 libgmp10
  libjansson4 libmnl0 libnftnl11 libxtables12 libffi8)

install_criu() {
  local apt=(-o "Dir::Etc::sourcelist=$APT_DIR/sources.list" -o Dir::Etc::sourceparts=-
    -o "Dir::State::Lists=$APT_DIR/lists" -o "Dir::Cache=$APT_DIR/cache")
  mkdir -p "$APT_DIR/lists/partial" "$APT_DIR/cache" "$APT_DIR/debs"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $CRIU_SUITE main" \
    > "$APT_DIR/sources.list"
  apt-get "${apt[@]}" update -qq
  (cd "$APT_DIR/debs" && apt-get "${apt[@]}" download "${CRIU_DEBS[@]}")
  rm -rf "$CRIU_ROOT"
  mkdir -p "$CRIU_ROOT"
  for deb in "$APT_DIR"/debs/*.deb; do dpkg-deb -x "$deb" "$CRIU_ROOT"; done
  write_wrappers
  "$CRIU_ROOT/criu" --version
  "$CRIU_ROOT/criu" check
}

write_wrappers() {
  local lib=$CRIU_ROOT/usr/lib/x86_64-linux-gnu
  cat > "$CRIU_ROOT/criu" <<EOF
#!/bin/sh
# Debian $CRIU_SUITE's CRIU with its own loader and libraries; the host's glibc is bookworm's.
CRIU_CONFIG_FILE=$CRIU_ROOT/criu.conf exec $lib/ld-linux-x86-64.so.2 \\
  --library-path $lib:$CRIU_ROOT/lib/x86_64-linux-gnu $CRIU_ROOT/usr/sbin/criu "\$@"
EOF
  # What runc's RPC request does not set (runc overrides what it does: file locks and TCP go through
  # runc's own flags, see the wrapper below). Chromium keeps a deleted 4 MiB BrowserMetrics .pma file
  # mapped (CRIU's default ghost limit is 1 MiB: "Can't dump ghost file ... increase limit"), and
  # inotify watches on /usr/share/zoneinfo/Etc and /etc/chromium/policies/managed, files on the image's
  # overlay whose handles cannot be opened again ("fsnotify: Can't dump that handle"): CRIU finds
  # them by path when told where to look.
  cat > "$CRIU_ROOT/criu.conf" <<EOF
ghost-limit 64M
irmap-scan-path /usr/share/zoneinfo
irmap-scan-path /etc/chromium
EOF
  # The engine's runtime: the host's runc, told where this CRIU is. Docker 20.10 passes no CRIU options
  # of its own (no --tcp-established, no annotations), so the words in $CRIU_ROOT/checkpoint-args and
  # restore-args (bench/snapshots.py writes them) go after runc's subcommand.
  cat > "$CRIU_ROOT/runc" <<'EOF'
#!/bin/bash
# CRIU's logs are kept in $root/logs: the shim removes a failed restore's work directory, log and all.
root=$(dirname "$(readlink -f "$0")")
args=() verb="" work="" prev=""
for word in "$@"; do
  args+=("$word")
  if [ "$word" = checkpoint ] || [ "$word" = restore ]; then
    verb=$word
    [ -s "$root/$word-args" ] && read -r -a extra < "$root/$word-args" && args+=("${extra[@]}")
  fi
  [ "$prev" = --work-path ] && work=$word
  [ "$prev" = --image-path ] && images=$word
  prev=$word
done
[ -z "$verb" ] && exec /usr/sbin/runc --criu "$root/criu" "${args[@]}"
# containerd unpacks a checkpoint to restore into a 0700 directory of root's (ctrd-checkpoint* under
# $TMPDIR); the restored tasks open the images (through a descriptor CRIU holds) from inside the
# container's user namespace, as root there and then as the container's own uids, where that is
# "Unable to open tty-info.img: Permission denied". The namespace's root is given the directory and
# every uid the search bit on it (0711: no listing); the engine's TMPDIR is a 0700 directory of
# root's, so no one else on the host gets to it by its path.
if [ "$verb" = restore ] && [ -n "${images:-}" ] && [ -s "$root/images-owner" ]; then
  chown -R "$(cat "$root/images-owner")" "$images"
  chmod 0711 "$images"
  log_images=$(ls -ld "$images" "$(dirname "$images")" 2>&1)
fi
rc=0
began=$(date +%s.%N)
/usr/sbin/runc --criu "$root/criu" "${args[@]}" || rc=$?
ended=$(date +%s.%N)
# containerd 1.6.20 leaves that unpacked copy behind after every restore (a sandbox's whole memory,
# about 340 MiB each): runc is done with it once it returns.
if [ "$verb" = restore ] && [ -n "${images:-}" ]; then
  case "$(basename "$images")" in ctrd-checkpoint*) rm -rf "$images" ;; esac
fi
if [ -n "$work" ]; then
  keep="$root/logs/$(date +%s.%N)-$verb-$rc"
  mkdir -p "$keep" && cp "$work"/*.log "$keep"/ 2>/dev/null
  echo "${log_images:-}" > "$keep/images-dir"
  echo "$began $ended" > "$keep/runc-seconds"
fi
exit $rc
EOF
  chmod 0755 "$CRIU_ROOT/criu" "$CRIU_ROOT/runc"
  mkdir -p "$CRIU_ROOT/logs"
  chmod 0700 "$CRIU_ROOT/logs"
}

up() {
  if [ -x "$CRIU_ROOT/usr/sbin/criu" ]; then write_wrappers; else install_criu; fi
  if [ -S "$SOCK" ] && docker -H "unix://$SOCK" version >/dev/null 2>&1; then
    echo "$NAME already up"
  else
    mkdir -p "$DATA" "$EXEC"
    local remap=()
    rm -f "$CRIU_ROOT/images-owner"
    if [ "$CRIU_USERNS" != none ]; then
      remap=(--userns-remap "$CRIU_USERNS")
      # The first host uid of the remapping (dockremap's range): root inside every container.
      local user=$CRIU_USERNS
      [ "$user" = default ] && user=dockremap
      local first
      first=$(awk -F: -v u="$user" '$1 == u {print $2; exit}' /etc/subuid)
      echo "$first:$first" > "$CRIU_ROOT/images-owner"
    fi
    # containerd unpacks a checkpoint to restore under $TMPDIR: a directory no one else can enter.
    mkdir -p -m 0700 "$DATA/tmp"
    # A bridge of its own, never --bridge=none: a dockerd started with no bridge deletes the host's
    # docker0 at its start (libnetwork's removeDefaultBridgeInterface), which breaks the main engine's
    # default network (every image build's RUN steps) until that engine restarts. Nothing is routed
    # through this one (no forwarding, no iptables); its sandboxes use --network none or internal networks.
    ip link show "$BRIDGE" >/dev/null 2>&1 || {
      ip link add "$BRIDGE" type bridge && ip addr add 192.0.2.1/24 dev "$BRIDGE" && ip link set "$BRIDGE" up
    }
    TMPDIR=$DATA/tmp dockerd "${remap[@]}" --experimental --data-root "$DATA" --exec-root "$EXEC" --pidfile "$PIDFILE" \
      -H "unix://$SOCK" --bridge="$BRIDGE" --iptables=false --ip-masq=false --ip-forward=false \
      --cgroup-parent /corral-criu --add-runtime "corral-criu=$CRIU_ROOT/runc" --default-runtime corral-criu \
      >"$LOG" 2>&1 &
    for _ in $(seq 1 100); do
      docker -H "unix://$SOCK" version >/dev/null 2>&1 && break
      sleep 0.2
    done
    docker -H "unix://$SOCK" version --format 'engine {{.Server.Version}} up at '"$SOCK"
  fi
  for image in "$@"; do
    docker save "$image" | docker -H "unix://$SOCK" load
  done
}

down() {
  if [ -f "$PIDFILE" ]; then
    local pid
    pid=$(cat "$PIDFILE")
    docker -H "unix://$SOCK" ps -aq | xargs -r docker -H "unix://$SOCK" rm -f >/dev/null || true
    # Its networks' bridges would outlive the daemon on the host.
    docker -H "unix://$SOCK" network ls -q --filter type=custom | xargs -r docker -H "unix://$SOCK" network rm >/dev/null || true
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  fi
  # The engine's own mounts (overlay layers, its containerd's shm) before its data goes.
  grep -E " ($DATA|$EXEC)" /proc/mounts | awk '{print $2}' | sort -r | xargs -r -n1 umount -l || true
  rm -rf "$DATA" "$EXEC" "$SOCK" "$PIDFILE"
  ip link del "$BRIDGE" 2>/dev/null || true
  rmdir /sys/fs/cgroup/*/corral-criu 2>/dev/null || true
  echo "$NAME down, $DATA removed"
}

case "${1:-}" in
  install-criu) install_criu ;;
  up) shift; up "$@" ;;
  down) down ;;
  purge) down; rm -rf "$CRIU_ROOT" "$APT_DIR"; echo "$CRIU_ROOT and $APT_DIR removed" ;;
  *) echo "usage: $0 install-criu | up [IMAGE...] | down | purge" >&2; exit 2 ;;
esac
