#!/bin/sh
# in-container.sh: run by nspawn-check.sh's container once systemd has
# booted it, as root: checks the installed units the way an operator uses
# them.  Prints each step; exits non-zero at the first that fails.
set -u
sock=/run/larder/larderd.sock
data=/srv/data/delta_byte_array.parquet
step() { echo "== $*"; }
fail() { echo "FAILED: $*"; journalctl -u larderd.service -u larderd.socket --no-pager | tail -40; exit 1; }

step "sysusers made the larder user"
getent passwd larder >/dev/null || fail "no larder user"

step "the socket unit starts; the service waits for a trainer"
systemctl enable --now larderd.socket || fail "cannot start larderd.socket"
[ -S "$sock" ] || fail "no socket at $sock"
systemctl is-active --quiet larderd.service && fail "larderd.service started before any trainer"

step "a trainer is served through the socket (socket activation)"
larder-example-trainer --socket "$sock" --epochs 2 --batch-size 100 "$data" || fail "the trainer failed"
systemctl is-active --quiet larderd.service || fail "larderd.service is not active after the trainer"
larderctl --socket "$sock" status || fail "larderctl status"

step "a trainer of another user reads what it may, and no more (CAP_SETUID under the unit)"
useradd -m -G larder trainer || fail "useradd"
cp "$data" /srv/data/secret.parquet && chmod 0600 /srv/data/secret.parquet
runuser -u trainer -- larder-example-trainer --socket "$sock" --epochs 1 --batch-size 100 "$data" \
  || fail "the larder group's trainer was not served"
out=$(runuser -u trainer -- larder-example-trainer --socket "$sock" --epochs 1 --batch-size 100 \
        /srv/data/secret.parquet 2>&1) && fail "a root-only file was served to another user: $out"
echo "$out" | grep -q 'Permission denied' || fail "the refusal does not say why: $out"

step "the cache is the configuration's, under CacheDirectory"
larderctl --socket "$sock" config | grep -q '^cache_dir *= /var/cache/larder$' || fail "cache_dir"
ls /var/cache/larder >/dev/null 2>&1 || fail "no /var/cache/larder"
stat -c '%U' /var/cache/larder | grep -qx larder || fail "/var/cache/larder is not larder's"

step "systemctl reload"
systemctl reload larderd.service || fail "reload"
i=0
until journalctl -u larderd.service --no-pager | grep -q 'reloaded'; do
  i=$((i + 1)); [ $i -lt 100 ] || fail "no reload in the journal"; sleep 0.1
done

step "systemctl restart, then a trainer again, from the cache"
systemctl restart larderd.service || fail "restart"
larder-example-trainer --socket "$sock" --epochs 1 --batch-size 100 "$data" || fail "the trainer after restart"
larderctl --socket "$sock" stats | grep -E 'hit ratio' || true

step "systemctl stop"
systemctl stop larderd.service larderd.socket || fail "stop"
systemctl is-active --quiet larderd.service && fail "still active after stop"
[ -S "$sock" ] && fail "the socket is still there after stop"
echo "all checks passed"
exit 0
