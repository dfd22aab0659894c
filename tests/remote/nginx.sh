#!/usr/bin/env bash
# nginx.sh: a static file server on 127.0.0.1 for tests (Debian's nginx), run
# as the current user with everything it writes under DIR.
#
#   nginx.sh start DIR ROOT [options]   start in the background (nginx's daemon
#                                        mode); prints the ready line and returns
#   nginx.sh run DIR ROOT [options]     the same in the foreground: prints the
#                                        ready line, then waits; SIGTERM/SIGINT
#                                        stop nginx and this script
#   nginx.sh stop DIR [ROOT]            SIGTERM to the master; waits until it is gone
#   nginx.sh reconfigure DIR [options]  rewrites the config (same port and root)
#                                        and reloads it (SIGHUP); waits for the
#                                        new workers
#
# Options:
#   --port N            the port (default: a free one)
#   --limit-rate RATE   nginx's limit_rate, per connection ("100m", "512k", 0 = none)
#   --no-range          ignore Range headers (max_ranges 0: 200 with the whole body)
#   --range             honour them again (for reconfigure; the default)
#   --workers N         worker processes (default 2)
#   --tls               HTTPS with a certificate made under DIR/tls (for
#                       127.0.0.1, localhost, *.s3.localhost), signed by a CA
#                       whose certificate is DIR/tls/ca.pem
#   --http2             HTTP/2 (with --tls; ALPN)
#   --watch-pid PID     stop nginx when process PID is gone (start and run;
#                       for test processes that may die without stopping it)
#
# Ready line (stdout, one JSON object):
#   {"port":N,"pid":N,"url":"http://127.0.0.1:N","dir":DIR,"root":ROOT,
#    "access_log":DIR/access.log,"error_log":DIR/error.log,"limit_rate":"0",
#    "ranges":true,"tls":false,"ca_file":null}
# ("run" adds "wrapper_pid", this script's pid.)  The access log has one JSON
# object a line: request line, Range header, status, bytes sent.
set -euo pipefail

NGINX=${NGINX:-/usr/sbin/nginx}
die() { echo "nginx.sh: $*" >&2; exit 1; }
usage() { sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

[ $# -ge 2 ] || usage
cmd=$1; dir=$2; shift 2
case $cmd in start|run|stop|reconfigure) ;; *) usage ;; esac
[ -x "$NGINX" ] || die "$NGINX not found (apt-get install nginx-light)"
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
settings=$dir/settings.env

root=""
if [ "$cmd" = start ] || [ "$cmd" = run ]; then
  [ $# -ge 1 ] || usage
  root=$1; shift
  [ -d "$root" ] || die "ROOT $root is not a directory"
  root=$(cd "$root" && pwd)
elif [ "$cmd" = stop ] && [ $# -ge 1 ] && [ "${1#--}" = "$1" ]; then
  shift # ROOT is accepted and ignored
fi

port=""; limit_rate=0; ranges=1; workers=2; tls=0; http2=0; watch_pid=""
if [ "$cmd" = reconfigure ]; then
  [ -f "$settings" ] || die "no $settings: was nginx started with this DIR?"
  # shellcheck disable=SC1090
  . "$settings"
fi
while [ $# -gt 0 ]; do
  case $1 in
    --port) port=$2; shift 2 ;;
    --port=*) port=${1#*=}; shift ;;
    --limit-rate) limit_rate=$2; shift 2 ;;
    --limit-rate=*) limit_rate=${1#*=}; shift ;;
    --no-range) ranges=0; shift ;;
    --range) ranges=1; shift ;;
    --workers) workers=$2; shift 2 ;;
    --workers=*) workers=${1#*=}; shift ;;
    --tls) tls=1; shift ;;
    --http2) http2=1; shift ;;
    --watch-pid) watch_pid=$2; shift 2 ;;
    --watch-pid=*) watch_pid=${1#*=}; shift ;;
    *) die "unknown option $1" ;;
  esac
done
[[ $limit_rate =~ ^[0-9]+[kKmMgG]?$ ]] || die "--limit-rate: not a size: $limit_rate"
[[ $workers =~ ^[0-9]+$ ]] || die "--workers: not a number: $workers"
[ "$http2" = 0 ] || [ "$tls" = 1 ] || die "--http2 needs --tls"
[ -z "$watch_pid" ] || [[ $watch_pid =~ ^[0-9]+$ ]] || die "--watch-pid: not a pid: $watch_pid"

pidfile=$dir/nginx.pid

master_pid() {
  [ -s "$pidfile" ] || return 1
  local p; p=$(cat "$pidfile")
  kill -0 "$p" 2>/dev/null || return 1
  echo "$p"
}

# A free port on 127.0.0.1: the kernel's choice (through node), else a random
# one below the ephemeral range that nothing listens on.
free_port() {
  if command -v node >/dev/null 2>&1; then
    node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})' && return
  fi
  local p
  for _ in $(seq 1 100); do
    p=$((20000 + RANDOM % 12000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
  done
  die "no free port found"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

make_tls() {
  local t=$dir/tls
  [ -s "$t/server.pem" ] && [ -s "$t/server.key" ] && [ -s "$t/ca.pem" ] && return
  command -v openssl >/dev/null 2>&1 || die "--tls needs the openssl command"
  mkdir -p "$t"
  (
    cd "$t"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
      -subj "/CN=larder test CA" -keyout ca.key -out ca.pem \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
      -subj "/CN=127.0.0.1" -keyout server.key -out server.csr
    printf '%s\n' "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:*.localhost,DNS:s3.localhost,DNS:*.s3.localhost" \
      "basicConstraints=CA:FALSE" "keyUsage=digitalSignature" "extendedKeyUsage=serverAuth" > server.ext
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile server.ext -out server.pem
  ) >"$dir/tls.log" 2>&1 || die "making the certificate failed (see $dir/tls.log)"
}

write_config() {
  local daemon=$1
  mkdir -p "$dir/tmp"
  local user_line="" listen_opts="" tls_lines="" range_line="" proto=http
  # As root, the workers would otherwise run as nobody and might not read ROOT.
  [ "$(id -u)" -eq 0 ] && user_line="user root root;"
  if [ "$tls" = 1 ]; then
    make_tls
    listen_opts=" ssl"
    [ "$http2" = 1 ] && listen_opts="$listen_opts http2"
    tls_lines="ssl_certificate $dir/tls/server.pem; ssl_certificate_key $dir/tls/server.key;"
    proto=https
  fi
  [ "$ranges" = 0 ] && range_line="max_ranges 0;"
  cat >"$dir/nginx.conf.new" <<EOF
# Written by tests/remote/nginx.sh; every path is under $dir.
$user_line
daemon $daemon;
master_process on;
worker_processes $workers;
pid $pidfile;
lock_file $dir/nginx.lock;
error_log $dir/error.log notice;
events { worker_connections 4096; }
http {
  default_type application/octet-stream;
  types { text/plain txt; application/json json; text/html html; }
  client_body_temp_path $dir/tmp/body;
  proxy_temp_path $dir/tmp/proxy;
  fastcgi_temp_path $dir/tmp/fastcgi;
  uwsgi_temp_path $dir/tmp/uwsgi;
  scgi_temp_path $dir/tmp/scgi;
  log_format larder escape=json '{"time":"\$time_iso8601","request":"\$request","range":"\$http_range","status":\$status,"body_bytes_sent":\$body_bytes_sent,"bytes_sent":\$bytes_sent,"request_time":\$request_time,"connection":\$connection,"connection_requests":\$connection_requests}';
  access_log $dir/access.log larder;
  sendfile on;
  tcp_nopush on;
  tcp_nodelay on;
  keepalive_timeout 65;
  keepalive_requests 100000;
  server_tokens off;
  gzip off;
  etag on;
  if_modified_since exact;
  server {
    listen 127.0.0.1:$port$listen_opts;
    server_name _;
    $tls_lines
    root $root;
    location / {
      limit_rate $limit_rate;
      $range_line
    }
  }
}
EOF
  mv "$dir/nginx.conf.new" "$dir/nginx.conf"
  cat >"$settings" <<EOF
port=$port
root='$root'
limit_rate=$limit_rate
ranges=$ranges
workers=$workers
tls=$tls
http2=$http2
EOF
  url="$proto://127.0.0.1:$port"
}

ready_line() {
  local pid=$1 extra=${2:-}
  local ca=null r=true
  [ "$tls" = 1 ] && ca="\"$dir/tls/ca.pem\""
  [ "$ranges" = 0 ] && r=false
  printf '{"port":%s,"pid":%s,"url":"%s","dir":"%s","root":"%s","access_log":"%s","error_log":"%s","limit_rate":"%s","ranges":%s,"tls":%s,"ca_file":%s%s}\n' \
    "$port" "$pid" "$url" "$dir" "$root" "$dir/access.log" "$dir/error.log" "$limit_rate" "$r" \
    "$([ "$tls" = 1 ] && echo true || echo false)" "$ca" "$extra"
}

# Waits until the master's pid file names a live process and the port accepts.
wait_ready() {
  local deadline=$((SECONDS + 15)) p
  while [ $SECONDS -lt $deadline ]; do
    if p=$(master_pid) && port_open "$port"; then echo "$p"; return 0; fi
    sleep 0.05
  done
  return 1
}

stop_nginx() {
  local p
  p=$(master_pid) || { rm -f "$pidfile"; return 0; }
  local kids
  kids=$(ps -o pid= --ppid "$p" 2>/dev/null || true)
  kill -TERM "$p" 2>/dev/null || true
  for _ in $(seq 1 200); do
    kill -0 "$p" 2>/dev/null || break
    sleep 0.05
  done
  if kill -0 "$p" 2>/dev/null; then
    echo "nginx.sh: nginx $p did not stop on SIGTERM; SIGKILL" >&2
    kill -KILL "$p" 2>/dev/null || true
  fi
  for k in $kids; do
    for _ in $(seq 1 100); do kill -0 "$k" 2>/dev/null || break; sleep 0.05; done
    kill -KILL "$k" 2>/dev/null || true
  done
  rm -f "$pidfile"
}

case $cmd in
  stop)
    p=$(master_pid || echo 0)
    stop_nginx
    printf '{"stopped":true,"pid":%s}\n' "$p"
    ;;

  reconfigure)
    p=$(master_pid) || die "nginx is not running in $dir"
    old=$(ps -o pid= --ppid "$p" | tr -d ' ' | sort)
    write_config on
    "$NGINX" -t -q -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" || die "the new config does not load (see $dir/error.log)"
    kill -HUP "$p"
    # Done when none of the old workers is still a child of the master.
    for _ in $(seq 1 200); do
      now=$(ps -o pid= --ppid "$p" | tr -d ' ' | sort)
      [ -n "$now" ] && [ -z "$(comm -12 <(echo "$old") <(echo "$now"))" ] && break
      sleep 0.05
    done
    ready_line "$p"
    ;;

  start|run)
    if p=$(master_pid); then die "nginx already running in $dir (pid $p); stop it first"; fi
    rm -f "$pidfile"
    given_port=$port
    for _ in 1 2 3 4 5; do
      [ -n "$given_port" ] || port=$(free_port)
      if [ "$cmd" = start ]; then
        write_config on
        if "$NGINX" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" 2>"$dir/start.err"; then
          if p=$(wait_ready); then
            if [ -n "$watch_pid" ]; then
              # A detached watcher: SIGTERM to the master once watch_pid is
              # gone (only while the pid still names this nginx master).
              (
                trap '' HUP
                while kill -0 "$watch_pid" 2>/dev/null && kill -0 "$p" 2>/dev/null; do sleep 0.5; done
                if grep -q "^nginx: master" "/proc/$p/cmdline" 2>/dev/null && [ "$(cat "$pidfile" 2>/dev/null)" = "$p" ]; then
                  kill -TERM "$p" 2>/dev/null || true
                fi
              ) </dev/null >/dev/null 2>&1 &
              disown
            fi
            ready_line "$p"
            exit 0
          fi
          stop_nginx
          die "nginx started but did not become ready (see $dir/error.log)"
        fi
      else
        write_config off
        "$NGINX" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" 2>"$dir/start.err" &
        npid=$!
        if p=$(wait_ready); then
          trap 'kill -TERM $npid 2>/dev/null || true' TERM INT HUP
          ready_line "$p" ",\"wrapper_pid\":$$"
          # Poll (a trapped signal interrupts the wait on the sleep).
          while kill -0 "$npid" 2>/dev/null; do
            if [ -n "$watch_pid" ] && ! kill -0 "$watch_pid" 2>/dev/null; then
              kill -TERM "$npid" 2>/dev/null || true
            fi
            sleep 0.2 &
            wait $! 2>/dev/null || true
          done
          wait "$npid" 2>/dev/null || true
          rm -f "$pidfile"
          exit 0
        fi
        kill -TERM "$npid" 2>/dev/null || true
        wait "$npid" 2>/dev/null || true
      fi
      # A port taken between choosing it and binding it: choose again.
      if [ -z "$given_port" ] && grep -q "Address already in use" "$dir/start.err" "$dir/error.log" 2>/dev/null; then
        : >"$dir/start.err"
        continue
      fi
      cat "$dir/start.err" >&2 || true
      die "nginx did not start (see $dir/error.log)"
    done
    die "no free port after 5 attempts"
    ;;
esac
