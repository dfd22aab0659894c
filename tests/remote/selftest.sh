#!/usr/bin/env bash
# selftest.sh: starts each loopback test server (nginx.sh, s3front.mjs,
# faultproxy.mjs), checks each feature with the curl command line, stops them,
# and prints "N passed, N failed".  Exit status 0 only when nothing failed.
#   KEEP=1 tests/remote/selftest.sh     keeps the scratch directory
#   VERBOSE=1 ...                       prints the servers' logs on failure
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/larder-remote-selftest.XXXXXX")
chmod 755 "$work"
pass=0
fail=0
pids=()
nginx_dirs=()
t_start=$SECONDS

cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for d in "${nginx_dirs[@]}"; do "$here/nginx.sh" stop "$d" >/dev/null 2>&1 || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
  done
  if [ "${KEEP:-0}" = 1 ]; then echo "scratch directory kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() {
  fail=$((fail + 1))
  echo "FAIL $1${2:+ ($2)}"
}
# check NAME COMMAND...: passes when the command succeeds.
check() {
  local name=$1
  shift
  if "$@"; then ok "$name"; else bad "$name"; fi
}
# expect NAME GOT WANT: passes when the strings are equal.
expect() {
  if [ "$2" = "$3" ]; then ok "$1"; else bad "$1" "got '$2', want '$3'"; fi
}
# expect_match NAME GOT REGEX
expect_match() {
  if [[ $2 =~ $3 ]]; then ok "$1"; else bad "$1" "got '$2', want /$3/"; fi
}

# A field of the first JSON object in a file ("a.b" for nested ones).
jget() {
  node -e '
    const fs = require("fs");
    const o = JSON.parse(fs.readFileSync(process.argv[1], "utf8").split("\n")[0]);
    const v = process.argv[2].split(".").reduce((a, k) => (a == null ? a : a[k]), o);
    console.log(v !== null && typeof v === "object" ? JSON.stringify(v) : v);
  ' "$1" "$2"
}

# A JavaScript expression over the first JSON object (o) in a file.
jexpr() {
  node -e 'const o = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8").split("\n")[0]);
    console.log(eval(process.argv[2]))' "$1" "$2"
}

# Starts a server in the background; waits for its ready line in $work/NAME.json.
start_bg() {
  local name=$1
  shift
  "$@" >"$work/$name.json" 2>"$work/$name.err" &
  local pid=$!
  pids+=("$pid")
  for _ in $(seq 1 300); do
    if grep -q '}' "$work/$name.json" 2>/dev/null; then return 0; fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  echo "--- $name did not start:" >&2
  cat "$work/$name.err" >&2
  return 1
}

port_closed() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
gone() {
  for _ in $(seq 1 100); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.05; done
  return 1
}
# The slice [off, off+len) of a file, for comparisons.
slice() { tail -c +"$(($2 + 1))" "$1" | head -c "$3"; }
same() { cmp -s "$1" "$2"; }

# curl's outcome as "HTTP_CODE BYTES EXIT_CODE" (body in $work/body).
fetch() {
  local out
  out=$(curl -sS -o "$work/body" -w '%{http_code} %{size_download}' "$@" 2>/dev/null)
  local rc=$?
  echo "$out $rc"
}
header() { # header NAME FILE: the value of a response header in a -D dump
  grep -i "^$1:" "$2" | head -1 | cut -d: -f2- | tr -d '\r' | sed 's/^ *//'
}

# ---------------------------------------------------------------------------
# Test data
data=$work/data
mkdir -p "$data/sub"
head -c 1003 /dev/urandom >"$data/small.bin"
head -c 1048576 /dev/urandom >"$data/1m.bin"
head -c 3000000 /dev/urandom >"$data/3m.bin"
printf 'hello world' >"$data/sub/odd name+(1)=x.txt"
for i in 1 2 3 4 5; do printf 'part %s\n' "$i" >"$data/sub/part-$i.txt"; done
chmod -R a+rX "$data"

echo "== nginx.sh"
ng=$work/nginx
nginx_dirs+=("$ng")
if "$here/nginx.sh" start "$ng" "$data" >"$work/nginx.json" 2>"$work/nginx.err"; then
  ok "nginx starts"
  NP=$(jget "$work/nginx.json" port)
  NPID=$(jget "$work/nginx.json" pid)
  N=http://127.0.0.1:$NP
  check "nginx: the ready line's pid is alive" kill -0 "$NPID"
  r=$(fetch "$N/3m.bin")
  expect "nginx: GET whole file" "$r" "200 3000000 0"
  check "nginx: whole file bytes" same "$work/body" "$data/3m.bin"
  curl -s -D "$work/h" -o "$work/body" -H 'Range: bytes=5-14' "$N/small.bin"
  expect "nginx: Range 5-14 Content-Range" "$(header content-range "$work/h")" "bytes 5-14/1003"
  check "nginx: Range 5-14 bytes" same "$work/body" <(slice "$data/small.bin" 5 10)
  curl -s -D "$work/h" -o "$work/body" -H 'Range: bytes=-100' "$N/small.bin"
  expect "nginx: suffix Range Content-Range" "$(header content-range "$work/h")" "bytes 903-1002/1003"
  check "nginx: suffix Range bytes" same "$work/body" <(tail -c 100 "$data/small.bin")
  check "nginx: ETag and Last-Modified" bash -c "grep -qi '^etag: \"' '$work/h' && grep -qi '^last-modified: ' '$work/h'"
  r=$(fetch -H "If-None-Match: $(header etag "$work/h")" "$N/small.bin")
  expect "nginx: If-None-Match gives 304" "$r" "304 0 0"
  check "nginx: access log has request, range, status, bytes" \
    grep -q '"request":"GET /small.bin HTTP/1.1","range":"bytes=5-14","status":206,"body_bytes_sent":10' "$ng/access.log"
  # Every path in the config is under DIR or ROOT.
  stray=$(grep -v '^ *location ' "$ng/nginx.conf" | grep -oE '(^|[ ])/[^ ;]*' | sed 's/^ //' |
    grep -v "^$ng" | grep -v "^$data" || true)
  expect "nginx: config paths only under DIR and ROOT" "$stray" ""
  "$here/nginx.sh" reconfigure "$ng" --no-range >/dev/null
  r=$(fetch -H 'Range: bytes=5-14' "$N/small.bin")
  expect "nginx: --no-range answers 200 with the whole body" "$r" "200 1003 0"
  "$here/nginx.sh" reconfigure "$ng" --range --limit-rate 2m >/dev/null
  # limit_rate is per connection (and nginx lets one second's worth go at
  # once): two parallel 3 MB downloads each take ~0.5 s, together not 1 s.
  t0=$(date +%s%N)
  curl -s -o /dev/null -w '%{time_total}\n' "$N/3m.bin" >"$work/t1" &
  par=$!
  curl -s -o /dev/null -w '%{time_total}\n' "$N/3m.bin" >"$work/t2"
  wait "$par"
  t1=$(cat "$work/t1")
  t2=$(cat "$work/t2")
  wall=$((($(date +%s%N) - t0) / 1000000))
  check "nginx: --limit-rate 2m throttles each connection (${t1}s, ${t2}s)" \
    awk -v a="$t1" -v b="$t2" 'BEGIN { exit !(a >= 0.3 && b >= 0.3) }'
  check "nginx: ... per connection, not in total (${wall} ms for both)" test "$wall" -lt 1300
  "$here/nginx.sh" reconfigure "$ng" --limit-rate 0 >/dev/null
  "$here/nginx.sh" stop "$ng" >/dev/null
  check "nginx: stop ends the master" gone "$NPID"
  check "nginx: stop frees the port" port_closed "$NP"

  # Foreground mode: SIGTERM to the wrapper stops nginx.
  ng2=$work/nginx-run
  nginx_dirs+=("$ng2")
  if start_bg nginx-run "$here/nginx.sh" run "$ng2" "$data"; then
    RP=$(jget "$work/nginx-run.json" port)
    RPID=$(jget "$work/nginx-run.json" pid)
    WPID=$(jget "$work/nginx-run.json" wrapper_pid)
    r=$(fetch -r 0-9 "http://127.0.0.1:$RP/small.bin")
    expect "nginx run: serves" "$r" "206 10 0"
    kill -TERM "$WPID"
    check "nginx run: SIGTERM to the wrapper stops nginx" gone "$RPID"
    check "nginx run: and the wrapper" gone "$WPID"
  else
    bad "nginx run: starts"
  fi

  # As a user without privileges (when there is one to switch to).
  if [ "$(id -u)" = 0 ] && id nobody >/dev/null 2>&1 && command -v setpriv >/dev/null 2>&1; then
    ng3=$work/nginx-nobody
    mkdir -p "$ng3"
    chown nobody "$ng3"
    nginx_dirs+=("$ng3")
    if setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups \
      "$here/nginx.sh" start "$ng3" "$data" >"$work/nginx-nobody.json" 2>"$work/nginx-nobody.err"; then
      r=$(fetch -r 0-9 "http://127.0.0.1:$(jget "$work/nginx-nobody.json" port)/small.bin")
      expect "nginx as nobody: serves" "$r" "206 10 0"
      check "nginx as nobody: stops" bash -c "setpriv --reuid=nobody --regid=$(id -g nobody) --clear-groups \
        '$here/nginx.sh' stop '$ng3' >/dev/null"
    else
      bad "nginx as nobody: starts" "$(cat "$work/nginx-nobody.err")"
    fi
  fi
else
  bad "nginx starts" "$(cat "$work/nginx.err")"
fi

echo "== sigv4-vectors.mjs"
if node "$here/sigv4-vectors.mjs" >"$work/vectors.out" 2>&1; then
  ok "SigV4 verification matches AWS's worked examples ($(tail -1 "$work/vectors.out"))"
else
  bad "SigV4 verification matches AWS's worked examples" "$(grep FAIL "$work/vectors.out" | head -3)"
fi

echo "== s3front.mjs"
EMPTY=e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855
AK=selftest-key
SK=selftest-secret
SIG=(--aws-sigv4 "aws:amz:us-east-1:s3" --user "$AK:$SK" -H "x-amz-content-sha256: $EMPTY")
if start_bg s3front node "$here/s3front.mjs" --bucket data --bucket other --access-key "$AK" --secret-key "$SK" \
  --log "$work/s3front.log"; then
  ok "s3front starts"
  SP=$(jget "$work/s3front.json" port)
  SPID=$(jget "$work/s3front.json" pid)
  S3RPID=$(jget "$work/s3front.json" s3rver_pid)
  S3RP=$(jget "$work/s3front.json" s3rver_port)
  S=http://127.0.0.1:$SP
  put=(node "$here/s3put.mjs" --endpoint "$S" --access-key "$AK" --secret-key "$SK")
  if "${put[@]}" --bucket data "$data" >"$work/put.json" 2>"$work/put.err"; then
    expect "s3put: uploads a directory (signed PUTs)" "$(jget "$work/put.json" count)" 9
  else
    bad "s3put: uploads a directory" "$(cat "$work/put.err")"
  fi
  "${put[@]}" --bucket data --secret-key wrong --key x "$data/small.bin" >/dev/null 2>"$work/put.err"
  check "s3put: a wrong secret is refused" grep -q SignatureDoesNotMatch "$work/put.err"

  r=$(fetch "${SIG[@]}" "$S/data/3m.bin")
  expect "curl --aws-sigv4: GET" "$r" "200 3000000 0"
  check "curl --aws-sigv4: GET bytes" same "$work/body" "$data/3m.bin"
  r=$(fetch "${SIG[@]}" -H 'Range: bytes=100-199' "$S/data/small.bin")
  expect "curl --aws-sigv4: GET with a signed Range header" "$r" "206 100 0"
  check "... bytes" same "$work/body" <(slice "$data/small.bin" 100 100)
  r=$(fetch "${SIG[@]}" -r 100-199 "$S/data/small.bin")
  expect "curl --aws-sigv4: GET with an unsigned Range (-r)" "$r" "206 100 0"
  curl -s -D "$work/h" -o "$work/body" "${SIG[@]}" -H 'Range: bytes=-100' "$S/data/small.bin"
  expect "suffix range: Content-Range" "$(header content-range "$work/h")" "bytes 903-1002/1003"
  check "suffix range: the last 100 bytes" same "$work/body" <(tail -c 100 "$data/small.bin")
  curl -s -o "$work/direct" -H 'Range: bytes=-100' "http://127.0.0.1:$S3RP/data/small.bin"
  if ! same "$work/direct" <(tail -c 100 "$data/small.bin"); then
    echo "     (s3rver alone answers bytes=-100 with $(stat -c %s "$work/direct") wrong bytes: the front's fix is needed)"
  fi
  r=$(fetch "${SIG[@]}" -H 'Range: bytes=0-0' "$S/data/small.bin")
  expect "range 0-0: one byte (s3rver alone sends everything)" "$r" "206 1 0"
  r=$(fetch "${SIG[@]}" -H 'Range: bytes=-5000' "$S/data/small.bin")
  expect "suffix longer than the object: the whole object" "$r" "206 1003 0"
  r=$(fetch "${SIG[@]}" -H 'Range: bytes=1003-' "$S/data/small.bin")
  expect "range past the end: 416" "$r" "416 $(stat -c %s "$work/body") 0"
  check "... InvalidRange" grep -q '<Code>InvalidRange</Code>' "$work/body"
  r=$(fetch "${SIG[@]}" -H 'If-Match: "nope"' "$S/data/small.bin")
  expect "If-Match mismatch: 412" "${r%% *}" 412

  r=$(fetch --aws-sigv4 "aws:amz:us-east-1:s3" --user "$AK:wrong" -H "x-amz-content-sha256: $EMPTY" "$S/data/small.bin")
  expect "wrong secret: 403" "${r%% *}" 403
  check "wrong secret: SignatureDoesNotMatch" grep -q '<Code>SignatureDoesNotMatch</Code>' "$work/body"
  r=$(fetch --aws-sigv4 "aws:amz:us-east-1:s3" --user "nobody:$SK" -H "x-amz-content-sha256: $EMPTY" "$S/data/small.bin")
  check "unknown key: 403 InvalidAccessKeyId" bash -c "[ '${r%% *}' = 403 ] && grep -q InvalidAccessKeyId '$work/body'"
  r=$(fetch --aws-sigv4 "aws:amz:eu-west-1:s3" --user "$AK:$SK" -H "x-amz-content-sha256: $EMPTY" "$S/data/small.bin")
  check "wrong region: 400 AuthorizationHeaderMalformed" bash -c "[ '${r%% *}' = 400 ] && grep -q AuthorizationHeaderMalformed '$work/body'"
  r=$(fetch --aws-sigv4 "aws:amz:us-east-1:s3" --user "$AK:$SK" "$S/data/small.bin")
  check "no x-amz-content-sha256: 400 InvalidRequest (as S3)" bash -c "[ '${r%% *}' = 400 ] && grep -q 'Missing required header for this request: x-amz-content-sha256' '$work/body'"
  r=$(fetch "$S/data/small.bin")
  check "unsigned: 403 AccessDenied" bash -c "[ '${r%% *}' = 403 ] && grep -q AccessDenied '$work/body'"
  r=$(fetch "${SIG[@]}" "$S/data/sub/odd%20name%2B%281%29%3Dx.txt")
  expect "key with reserved characters (encoded as AWS does)" "$r" "200 11 0"

  r=$(fetch "${SIG[@]}" "$S/data?list-type=2&max-keys=2&prefix=sub%2F")
  expect "ListObjectsV2 with curl (sorted query)" "$r" "200 $(stat -c %s "$work/body") 0"
  check "... 2 keys, truncated" bash -c "grep -q '<KeyCount>2</KeyCount>' '$work/body' && grep -q '<IsTruncated>true</IsTruncated>' '$work/body'"
  token=$(grep -o '<NextContinuationToken>[^<]*' "$work/body" | sed 's/.*>//')
  enc=$(node -e 'console.log(encodeURIComponent(process.argv[1]).replace(/[!()*\x27]/g, c => "%" + c.charCodeAt(0).toString(16).toUpperCase()))' "$token")
  r=$(fetch "${SIG[@]}" "$S/data?continuation-token=$enc&list-type=2&max-keys=2&prefix=sub%2F")
  check "ListObjectsV2 page 2 with curl (token first, %XX uppercase)" \
    bash -c "[ '${r%% *}' = 200 ] && grep -q '<Key>sub/part-2.txt</Key>' '$work/body'"
  r=$(fetch "${SIG[@]}" "$S/data?list-type=2&max-keys=2&prefix=sub%2F&continuation-token=$enc")
  check "unsorted query from curl 7.88: 403 SignatureDoesNotMatch (as S3)" \
    bash -c "[ '${r%% *}' = 403 ] && grep -q SignatureDoesNotMatch '$work/body'"
  if node "$here/s3list.mjs" --endpoint "$S" --access-key "$AK" --secret-key "$SK" --bucket data --max-keys 2 \
    --expect-count 9 >"$work/list.json" 2>&1; then
    expect "s3list: paginates (9 keys, max-keys 2)" "$(jget "$work/list.json" pages)" 5
  else
    bad "s3list: paginates" "$(cat "$work/list.json")"
  fi
  if node "$here/s3list.mjs" --endpoint "$S" --access-key "$AK" --secret-key "$SK" --bucket data --max-keys 1 \
    --prefix sub/ --expect-count 6 --virtual-host >"$work/list.json" 2>&1; then
    expect "s3list: paginates, virtual-hosted" "$(jget "$work/list.json" pages)" 6
  else
    bad "s3list: paginates, virtual-hosted" "$(cat "$work/list.json")"
  fi

  r=$(fetch "${SIG[@]}" -r 10-19 "http://data.s3.localhost:$SP/small.bin")
  expect "virtual-hosted: data.s3.localhost" "$r" "206 10 0"
  check "... bytes" same "$work/body" <(slice "$data/small.bin" 10 10)
  r=$(fetch "${SIG[@]}" --resolve "data.127.0.0.1:$SP:127.0.0.1" "http://data.127.0.0.1:$SP/small.bin")
  expect "virtual-hosted: data.127.0.0.1 (--resolve)" "$r" "200 1003 0"
  r=$(fetch "${SIG[@]}" "http://data.s3.localhost:$SP/?list-type=2&prefix=sub%2F")
  check "virtual-hosted: ListObjectsV2" bash -c "[ '${r%% *}' = 200 ] && grep -q '<KeyCount>6</KeyCount>' '$work/body'"

  # Faults, set through the control endpoint.
  ctl() { curl -s -XPOST --data "$2" "$1/__control" >"$work/ctl.json"; }
  ctl "$S" '{"reset_stats":true,"add":{"type":"status","status":503,"count":2}}'
  r1=$(fetch "${SIG[@]}" "$S/data/small.bin")
  grep -q '<Code>SlowDown</Code>' "$work/body" && sd=1 || sd=0
  r2=$(fetch "${SIG[@]}" "$S/data/small.bin")
  r3=$(fetch "${SIG[@]}" "$S/data/small.bin")
  expect "fault 503 SlowDown x2, then 200" "${r1%% *} $sd ${r2%% *} ${r3%% *}" "503 1 503 200"
  ctl "$S" '{"add":{"type":"status","status":500}}'
  r=$(fetch "${SIG[@]}" "$S/data/small.bin")
  check "fault 500 InternalError" bash -c "[ '${r%% *}' = 500 ] && grep -q InternalError '$work/body'"
  ctl "$S" '{"add":{"type":"cut","after_bytes":100000}}'
  r=$(fetch "${SIG[@]}" "$S/data/3m.bin")
  expect_match "fault cut after 100000 bytes: curl error 56/18" "$r" '^200 [0-9]+ (56|18)$'
  expect_match "... at most 100000 bytes" "$(echo "$r" | cut -d' ' -f2)" '^(100000|[0-9]{1,5})$'
  ctl "$S" '{"add":{"type":"short","missing":3}}'
  r=$(fetch "${SIG[@]}" "$S/data/small.bin")
  expect "fault short body: Content-Length 1003, 1000 sent, curl error 18" "$r" "200 1000 18"
  ctl "$S" '{"add":{"type":"stall","seconds":5}}'
  r=$(fetch -m 1 "${SIG[@]}" "$S/data/small.bin")
  expect "fault stall: nothing for 5 s (curl -m 1 times out)" "$r" "000 0 28"
  ctl "$S" '{"add":{"type":"latency","ms":400,"count":1}}'
  t=$(curl -s -o /dev/null -w '%{time_total}' "${SIG[@]}" "$S/data/small.bin")
  check "fault latency 400 ms (${t}s)" awk -v t="$t" 'BEGIN { exit !(t >= 0.39) }'
  ctl "$S" '{"add":{"type":"wrong_bytes"}}'
  curl -s -D "$work/h" -o "$work/body" "${SIG[@]}" -H 'Range: bytes=0-99' "$S/data/small.bin"
  check "fault wrong_bytes: claims bytes 0-99, sends bytes 100-199" bash -c \
    "grep -qi '^content-range: bytes 0-99/1003' '$work/h' && cmp -s '$work/body' <(tail -c +101 '$data/small.bin' | head -c 100)"
  ctl "$S" '{"add":{"type":"wrong_content_range","shift":7}}'
  curl -s -D "$work/h" -o "$work/body" "${SIG[@]}" -H 'Range: bytes=0-99' "$S/data/small.bin"
  expect "fault wrong_content_range" "$(header content-range "$work/h")" "bytes 7-106/1003"
  ctl "$S" '{"add":{"type":"status","status":503,"prefix":"/data/sub/","count":1}}'
  r1=$(fetch "${SIG[@]}" "$S/data/small.bin")
  r2=$(fetch "${SIG[@]}" "$S/data/sub/part-1.txt")
  expect "fault matching a path prefix" "${r1%% *} ${r2%% *}" "200 503"
  curl -s "$S/__stats" >"$work/stats.json"
  expect "stats: requests per path" "$(jexpr "$work/stats.json" 'o.by_path["/data/small.bin"].requests')" 10
  expect "stats: per status" "$(jget "$work/stats.json" 'by_status.503')" 3
  check "stats: bytes sent" test "$(jget "$work/stats.json" bytes_sent)" -gt 100000
  curl -s "$S/__requests" >"$work/requests.json"
  check "/__requests lists the requests with their faults" grep -q '"fault":"wrong_bytes"' "$work/requests.json"
  check "log file has one JSON line per request" grep -q '"event":"request".*"status":206' "$work/s3front.log"

  kill -TERM "$SPID"
  check "s3front: SIGTERM stops it" gone "$SPID"
  check "s3front: and s3rver" gone "$S3RPID"
  check "s3front: the port is free" port_closed "$SP"
else
  bad "s3front starts"
fi

# A second front: a session token, and a fault from the command line.
if start_bg s3front2 node "$here/s3front.mjs" --bucket b --access-key "$AK" --secret-key "$SK" \
  --session-token tok123 --region eu-west-1 --fault 'status,status=503,count=1'; then
  S=http://127.0.0.1:$(jget "$work/s3front2.json" port)
  SIGT=(--aws-sigv4 "aws:amz:eu-west-1:s3" --user "$AK:$SK" -H "x-amz-content-sha256: $EMPTY")
  r=$(fetch "${SIGT[@]}" -H 'x-amz-security-token: tok123' "$S/b?list-type=2")
  expect "--fault at start: the first request gets 503" "${r%% *}" 503
  r=$(fetch "${SIGT[@]}" -H 'x-amz-security-token: tok123' "$S/b?list-type=2")
  expect "session token: signed request with the token passes" "${r%% *}" 200
  r=$(fetch "${SIGT[@]}" "$S/b?list-type=2")
  check "session token: missing token gives 403 InvalidToken" bash -c "[ '${r%% *}' = 403 ] && grep -q InvalidToken '$work/body'"
else
  bad "s3front with a session token starts"
fi

echo "== faultproxy.mjs"
ng4=$work/nginx-up
nginx_dirs+=("$ng4")
if "$here/nginx.sh" start "$ng4" "$data" >"$work/nginx-up.json" 2>&1 &&
  start_bg faultproxy node "$here/faultproxy.mjs" --upstream "http://127.0.0.1:$(jget "$work/nginx-up.json" port)" \
    --log "$work/faultproxy.log" --fault '{"type":"429","count":1,"retry_after":1}'; then
  ok "faultproxy starts in front of nginx"
  FPID=$(jget "$work/faultproxy.json" pid)
  FP=$(jget "$work/faultproxy.json" port)
  F=http://127.0.0.1:$FP
  curl -s -D "$work/h" -o "$work/body" "$F/small.bin"
  check "--fault at start: 429 with Retry-After" bash -c "grep -q '^HTTP/1.1 429' '$work/h' && grep -qi '^retry-after: 1' '$work/h'"
  r=$(fetch "$F/3m.bin")
  expect "proxied GET" "$r" "200 3000000 0"
  check "... bytes" same "$work/body" "$data/3m.bin"
  r=$(fetch -r 5-14 "$F/small.bin")
  expect "proxied Range" "$r" "206 10 0"
  ctl "$F" '{"add":[{"type":"500"},{"type":"503"}]}'
  r1=$(fetch "$F/small.bin")
  r2=$(fetch "$F/small.bin")
  r3=$(fetch "$F/small.bin")
  expect "500 then 503 then 200" "${r1%% *} ${r2%% *} ${r3%% *}" "500 503 200"
  ctl "$F" '{"add":{"type":"cut","after_bytes":4096,"mode":"fin"}}'
  r=$(fetch "$F/1m.bin")
  expect "cut (fin) after 4096 bytes" "$r" "200 4096 18"
  ctl "$F" '{"add":{"type":"cut","after_bytes":0}}'
  r=$(fetch "$F/1m.bin")
  expect_match "cut (rst) after the headers" "$r" '^200 0 (56|18)$'
  ctl "$F" '{"add":{"type":"drop"}}'
  r=$(fetch "$F/small.bin")
  expect "drop: no response at all" "$r" "000 0 52"
  ctl "$F" '{"add":{"type":"short"}}'
  r=$(fetch "$F/small.bin")
  expect "short body (half)" "$r" "200 502 18"
  ctl "$F" '{"add":{"type":"stall","seconds":1,"after_bytes":500,"then":"continue"}}'
  t=$(curl -s -o "$work/body" -w '%{time_total}' "$F/small.bin")
  check "stall mid-body then continue (${t}s)" bash -c \
    "awk -v t='$t' 'BEGIN { exit !(t >= 0.95) }' && cmp -s '$work/body' '$data/small.bin'"
  ctl "$F" '{"add":{"type":"ignore_range"}}'
  r=$(fetch -r 5-14 "$F/small.bin")
  expect "ignore_range: 200 with the whole body" "$r" "200 1003 0"
  ctl "$F" '{"add":{"type":"wrong_bytes","shift":1}}'
  curl -s -D "$work/h" -o "$work/body" -r 5-14 "$F/small.bin"
  check "wrong_bytes (shift 1): claims 5-14, sends 6-15" bash -c \
    "grep -qi '^content-range: bytes 5-14/1003' '$work/h' && cmp -s '$work/body' <(tail -c +7 '$data/small.bin' | head -c 10)"
  ctl "$F" '{"add":{"type":"wrong_bytes"}}'
  curl -s -D "$work/h" -o "$work/body" -r -10 "$F/small.bin"
  check "wrong_bytes on a suffix range: claims 993-1002, sends 983-992" bash -c \
    "grep -qi '^content-range: bytes 993-1002/1003' '$work/h' && cmp -s '$work/body' <(tail -c +984 '$data/small.bin' | head -c 10)"
  ctl "$F" '{"add":{"type":"wrong_content_range","value":"bytes 0-9/5"}}'
  curl -s -D "$work/h" -o /dev/null -r 5-14 "$F/small.bin"
  expect "wrong_content_range (literal value)" "$(header content-range "$work/h")" "bytes 0-9/5"
  ctl "$F" '{"add":{"type":"corrupt","at":10}}'
  curl -s -o "$work/body" "$F/small.bin"
  check "corrupt: one byte flipped" bash -c "[ \$(cmp -l '$work/body' '$data/small.bin' | wc -l) = 1 ]"
  ctl "$F" '{"latency_ms":250}'
  t=$(curl -s -o /dev/null -w '%{time_total}' "$F/small.bin")
  ctl "$F" '{"latency_ms":0}'
  check "latency_ms for every request (${t}s)" awk -v t="$t" 'BEGIN { exit !(t >= 0.24) }'

  # The bandwidth cap is shared by all connections: three parallel 1 MiB
  # downloads at 2 MiB/s take ~1.5 s together.
  ctl "$F" '{"rate":2097152}'
  t0=$(date +%s%N)
  par=()
  for i in 1 2 3; do
    curl -s -o "$work/par$i" "$F/1m.bin" &
    par+=($!)
  done
  wait "${par[@]}"
  wall=$((($(date +%s%N) - t0) / 1000000))
  ctl "$F" '{"rate":0}'
  check "--rate caps the total: 3 MiB at 2 MiB/s in ${wall} ms (1200..2500)" \
    bash -c "[ $wall -ge 1200 ] && [ $wall -le 2500 ]"
  check "... and the bytes are intact" bash -c "cmp -s '$work/par1' '$data/1m.bin' && cmp -s '$work/par3' '$data/1m.bin'"
  ctl "$F" '{"conn_rate":4194304}'
  t=$(curl -s -o /dev/null -w '%{time_total}' "$F/3m.bin")
  ctl "$F" '{"conn_rate":0}'
  check "--conn-rate caps each connection: 3 MB at 4 MiB/s (${t}s)" awk -v t="$t" 'BEGIN { exit !(t >= 0.6 && t <= 1.5) }'

  curl -s "$F/__stats" >"$work/stats.json"
  expect "stats: per-status counts" "$(jget "$work/stats.json" 'by_status.429') $(jget "$work/stats.json" 'by_status.500')" "1 1"
  check "stats: requests and bytes" bash -c "[ $(jget "$work/stats.json" requests) -ge 20 ] && [ $(jget "$work/stats.json" bytes_sent) -gt 3000000 ]"
  r=$(curl -s -XPOST --data '{"add":{"type":"bogus"}}' -o "$work/body" -w '%{http_code}' "$F/__control")
  check "control: a bad rule is a 400 with the reason" bash -c "[ $r = 400 ] && grep -q 'unknown fault type' '$work/body'"

  kill -TERM "$FPID"
  check "faultproxy: SIGTERM stops it" gone "$FPID"
  check "faultproxy: the port is free" port_closed "$FP"
else
  bad "faultproxy starts in front of nginx" "$(cat "$work/faultproxy.err" 2>/dev/null)"
fi
"$here/nginx.sh" stop "$ng4" >/dev/null 2>&1 || true

echo "== --watch-pid"
sleep 1 &
watched=$!
if start_bg watched node "$here/faultproxy.mjs" --upstream http://127.0.0.1:9 --watch-pid "$watched"; then
  WFP=$(jget "$work/watched.json" pid)
  wait "$watched"
  check "faultproxy --watch-pid: exits when the watched process is gone" gone "$WFP"
else
  bad "faultproxy --watch-pid starts"
fi

if [ "$fail" -gt 0 ] && [ "${VERBOSE:-0}" = 1 ]; then
  for f in "$work"/*.err "$work"/*.log; do [ -s "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done
fi
echo "($((SECONDS - t_start)) s)"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
