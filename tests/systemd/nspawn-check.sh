#!/usr/bin/env bash
# nspawn-check.sh BUILD_DIR WORK: the systemd units as a training node runs
# them, under a real systemd as PID 1.
#
# A Debian 12 container (debootstrap, minbase, with the libraries larderd
# loads, kept in WORK/base between runs) gets larder by `make install
# DESTDIR=...`, then boots with systemd-nspawn.  A unit in it runs
# tests/systemd/in-container.sh once the system is up, which checks, as an
# operator would: sysusers made the larder user; the socket unit starts and
# the service stays down until a trainer connects (socket activation); a
# trainer is served through the socket; `systemctl reload` reloads; restart
# and stop work; the hardening lets larderd write its cache.  The container
# powers itself off and this script reports what it found.
#
# Exit status: 0 when every check passed, or when nothing here can boot a
# container (no root, no debootstrap or systemd-nspawn, no Debian mirror),
# which it says; 1 when the container booted and a check failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:?usage: nspawn-check.sh BUILD_DIR WORK}
work=${2:?usage: nspawn-check.sh BUILD_DIR WORK}
skip() { echo "nspawn-check: skipped: $*"; exit 0; }
[ "$(id -u)" = 0 ] || skip "needs root"
command -v debootstrap >/dev/null || skip "no debootstrap (apt-get install debootstrap)"
command -v systemd-nspawn >/dev/null || skip "no systemd-nspawn (apt-get install systemd-container)"
mkdir -p "$work"
work=$(cd "$work" && pwd)
base=$work/base
root=$work/root

# The libraries the programs load, as Debian packages.
pkgs=systemd,systemd-sysv,dbus
for lib in $(for b in larderd larderctl example-trainer; do ldd "$build/bin/$b"; done |
             awk '/=>/{print $3}' | sort -u); do
  p=$(dpkg -S "$lib" 2>/dev/null || dpkg -S "/usr$lib" 2>/dev/null ||
      dpkg -S "$(readlink -f "$lib")" 2>/dev/null)
  p=$(echo "$p" | head -1 | cut -d: -f1)
  [ -n "$p" ] && pkgs="$pkgs,$p"
done
stamp=$(echo "$pkgs" | sha256sum | cut -c1-16)
if [ ! -f "$base/.larder-$stamp" ]; then
  rm -rf "$base"
  echo "nspawn-check: debootstrap (once; kept in $base)"
  debootstrap --variant=minbase --include="$pkgs" bookworm "$base" http://deb.debian.org/debian \
    >"$work/debootstrap.log" 2>&1 || { tail -5 "$work/debootstrap.log"; skip "debootstrap failed (no Debian mirror?)"; }
  touch "$base/.larder-$stamp"
fi

rm -rf "$root"
cp -a "$base" "$root"
make --no-print-directory install DESTDIR="$root" PREFIX=/usr SYSCONFDIR=/etc \
  >"$work/install.log" 2>&1 || { tail -20 "$work/install.log"; echo "nspawn-check: make install failed"; exit 1; }
mkdir -p "$root/srv/data"
cp tests/data/parquet-testing/data/delta_byte_array.parquet "$root/srv/data/"
install -m 0755 tests/systemd/in-container.sh "$root/usr/local/bin/larder-check"
cat >"$root/etc/systemd/system/larder-check.service" <<'EOF'
[Unit]
Description=larder's checks of its own units
After=multi-user.target
[Service]
Type=oneshot
ExecStart=/bin/sh -c '/usr/local/bin/larder-check >/var/log/larder-check.out 2>&1; echo $? >/var/log/larder-check.rc'
ExecStartPost=/bin/systemctl --no-block poweroff
[Install]
WantedBy=multi-user.target
EOF
mkdir -p "$root/etc/systemd/system/multi-user.target.wants"
ln -sf /etc/systemd/system/larder-check.service "$root/etc/systemd/system/multi-user.target.wants/"

echo "nspawn-check: booting the container"
timeout "${NSPAWN_TIMEOUT:-300}" systemd-nspawn -q --register=no --keep-unit -D "$root" -b \
  >"$work/boot.log" 2>&1
boot=$?
if [ ! -f "$root/var/log/larder-check.rc" ]; then
  tail -20 "$work/boot.log"
  [ $boot = 124 ] && { echo "nspawn-check: the container booted but the checks did not finish"; exit 1; }
  skip "systemd-nspawn could not boot a container here (status $boot; log: $work/boot.log)"
fi
cat "$root/var/log/larder-check.out"
rc=$(cat "$root/var/log/larder-check.rc")
[ "$rc" = 0 ] && echo "nspawn-check: the units work under systemd" && exit 0
echo "nspawn-check: FAILED (status $rc)"
exit 1
