#!/usr/bin/env bash
# make demo: a Consul dev agent, three hastate replicas (one raft cluster) and,
# when HAProxy is installed, an HAProxy that load-balances the agent port and
# polls two example backends. Ctrl-C stops everything.
#
#   scripts/demo.sh                      # run the demo (make demo)
#   scripts/demo.sh stop                 # stop a demo, or what is left of one
#                                        # (its pids are in .demo/*.pid)
#   scripts/demo.sh restart hastate-0    # from another shell: restart a replica
#                                        # of the running demo (stop it if it
#                                        # runs, start it again); Ctrl-C of the
#                                        # demo stops it too
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
demo=$root/.demo
bin=$root/bin/hastate
peers="hastate-0=127.0.0.2:9779,hastate-1=127.0.0.3:9779,hastate-2=127.0.0.4:9779"

# Every process runs in a session of its own (setsid): Ctrl-C reaches only
# this script, whose cleanup stops them in order. Sharing the terminal's
# process group, Consul got the SIGINT too and exited first, and the demo
# said "consul exited unexpectedly" before "stopping".

# start_replica i: start replica hastate-i in the background; its pid goes
# to $demo/hastate-i.pid (the demo's cleanup reads it, so a restarted
# replica is stopped with the rest).
start_replica() {
  local i=$1 ip=127.0.0.$(($1+2))
  HASTATE_PEERS=$peers setsid "$bin" serve --node-id hastate-$i --data-dir "$demo/hastate-$i" \
    --agent-addr $ip:9777 --http-addr $ip:9778 --raft-addr $ip:9779 --raft-advertise $ip:9779 \
    --ramp-duration 60s --ramp-interval 5s \
    --log-format json >>"$demo/hastate-$i.log" 2>&1 &
  echo $! >"$demo/hastate-$i.pid"
}

# stop_pid pid [seconds]: SIGTERM, wait (default 30s), then SIGKILL.
stop_pid() {
  local pid=$1 n=$((${2:-30}*10))
  kill -TERM "$pid" 2>/dev/null || return 0
  while kill -0 "$pid" 2>/dev/null && [ $((n--)) -gt 0 ]; do sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}

# demo_pids: "name pid" for each process of a demo (this one or an earlier
# one) that still runs, from its pid files: HAProxy, the replicas, Consul
# last (the order to stop them in). A pid whose command is not the demo's
# (reused since) is left out.
demo_pids() {
  local f n p
  for n in haproxy hastate-2 hastate-1 hastate-0 consul; do
    f=$demo/$n.pid
    p=$(cat "$f" 2>/dev/null) || continue
    [[ $p =~ ^[0-9]+$ ]] && kill -0 "$p" 2>/dev/null || continue
    case $n in hastate-*) grep -qa -- "--node-id" "/proc/$p/cmdline" 2>/dev/null || continue ;; esac
    echo "$n $p"
  done
}

if [ "${1:-}" = stop ]; then
  # The demo script first, if it runs: its cleanup stops the rest in order.
  if d=$(cat "$demo/demo.pid" 2>/dev/null) && kill -0 "$d" 2>/dev/null; then
    echo "demo: stopping the demo (pid $d)"
    stop_pid "$d" 60
  fi
  left=$(demo_pids)
  if [ -z "$left" ]; then
    echo "demo: no demo process runs"
    exit 0
  fi
  while read -r n p; do
    echo "demo: stopping $n (pid $p)"
    stop_pid "$p"
  done <<<"$left"
  rm -f "$demo/demo.pid"
  echo "demo: stopped (logs and data kept in $demo)"
  exit 0
elif [ "${1:-}" = restart ]; then
  r=${2:-}
  if ! [[ $r =~ ^hastate-([012])$ ]]; then
    echo "usage: scripts/demo.sh restart hastate-0|hastate-1|hastate-2" >&2
    exit 2
  fi
  i=${BASH_REMATCH[1]}
  if ! kill -0 "$(cat "$demo/demo.pid" 2>/dev/null || echo 0)" 2>/dev/null; then
    echo "demo: no demo is running (start one with make demo)" >&2
    exit 1
  fi
  touch "$demo/hastate-$i.restarting"
  if old=$(cat "$demo/hastate-$i.pid" 2>/dev/null) && kill -0 "$old" 2>/dev/null; then
    echo "demo: stopping $r (pid $old)"
    stop_pid "$old"
  fi
  start_replica "$i"
  rm -f "$demo/hastate-$i.restarting"
  pid=$(cat "$demo/hastate-$i.pid")
  for _ in $(seq 150); do
    curl -fs -o /dev/null "http://127.0.0.$((i+2)):9778/-/readiness" && break
    kill -0 "$pid" 2>/dev/null || { echo "demo: $r (pid $pid) exited at start; see $demo/$r.log" >&2; exit 1; }
    sleep 0.2
  done
  echo "demo: $r restarted (pid $pid; log: $demo/$r.log); Ctrl-C of the demo stops it too"
  exit 0
elif [ -n "${1:-}" ]; then
  echo "usage: scripts/demo.sh [stop | restart hastate-0|hastate-1|hastate-2]" >&2
  exit 2
fi

consul=${CONSUL_BIN:-$(scripts/ensure-consul.sh)}
haproxy=${HAPROXY_BIN:-$(command -v haproxy || echo /usr/sbin/haproxy)}

consul_pid= haproxy_pid=
pids=() # children: Consul, the replicas, HAProxy
# say: a line for the operator on stderr, which may be gone: `make demo |
# tee log` and Ctrl-C kill tee first. A failed write must not stop the
# cleanup (SIGPIPE is ignored there), or Consul, HAProxy and the replicas
# would be left running without a parent.
say() { printf '%s\n' "$*" >&2 || true; }
cleanup() {
  trap - INT TERM HUP PIPE EXIT
  trap '' PIPE
  set +e
  say ""; say "demo: stopping..."
  # HAProxy and the replicas (also those restarted from another shell,
  # which are no children of this script) first, Consul last.
  local stop=() n p
  while read -r n p; do
    [ "$n" = consul ] || stop+=("$p")
  done < <(demo_pids)
  for p in "${stop[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${stop[@]}"; do stop_pid "$p"; done
  [ -n "$consul_pid" ] && stop_pid "$consul_pid"
  wait 2>/dev/null
  rm -f "$demo/demo.pid"
  say "demo: stopped (logs and data kept in $demo)"
  exit 0
}

# Every address the demo listens on: a previous demo left running (its
# script killed) holds them.
busy=()
for a in 127.0.0.1:8500 127.0.0.1:9777 127.0.0.1:9778 127.0.0.1:9881 127.0.0.1:9882 127.0.0.1:9883 127.0.0.1:9884 \
  127.0.0.2:9777 127.0.0.2:9778 127.0.0.2:9779 127.0.0.3:9777 127.0.0.3:9778 127.0.0.3:9779 127.0.0.4:9777 127.0.0.4:9778 127.0.0.4:9779; do
  if (exec 3<>"/dev/tcp/${a%:*}/${a#*:}") 2>/dev/null; then busy+=("$a"); fi
done
if [ ${#busy[@]} -gt 0 ]; then
  echo "demo: ${busy[*]} already in use" >&2
  left=$(demo_pids)
  if [ -n "$left" ]; then
    echo "demo: a previous demo still runs: $(echo "$left" | sed 's/ / pid /' | paste -sd, - | sed 's/,/, /g')" >&2
    echo "demo: stop it with: scripts/demo.sh stop" >&2
  else
    if command -v ss >/dev/null; then
      echo "demo: listening there:" >&2
      ss -Hltnp 2>/dev/null | grep -F -e "${busy[0]}" -e "*:${busy[0]#*:}" | sed 's/^/  /' >&2 || true
    fi
    echo "demo: stop what listens there and retry (scripts/demo.sh stop stops what an earlier demo left)" >&2
  fi
  exit 1
fi

rm -rf "$demo"; mkdir -p "$demo/bin"
# consul on the PATH the demo prints, as `consul` (the cached build has
# its version in its name).
ln -s "$(realpath "$consul")" "$demo/bin/consul"
trap cleanup INT TERM HUP PIPE EXIT
echo $$ >"$demo/demo.pid"
echo "demo: starting Consul dev agent on 127.0.0.1:8500 (log: $demo/consul.log)"
setsid "$consul" agent -dev -bind 127.0.0.1 -client 127.0.0.1 -dns-port -1 -grpc-port -1 >"$demo/consul.log" 2>&1 &
consul_pid=$!
echo $! >"$demo/consul.pid"
pids+=($!)
export CONSUL_HTTP_ADDR=127.0.0.1:8500
for _ in $(seq 100); do
  "$consul" kv put hastate/config/demo started >/dev/null 2>&1 && break
  sleep 0.2
done
"$consul" kv delete hastate/config/demo >/dev/null

# Seed an example: one drained server with a reason, one at 50%. --force:
# no replica runs yet to tell which servers HAProxy polls.
"$bin" drain canary_web/web-2 --reason "demo: zonal maintenance" --by demo --force >/dev/null 2>&1
"$bin" weight 50% canary_api/api-1 --by demo --force >/dev/null 2>&1

declare -A replica # pid -> name, for the replicas this script started
for i in 0 1 2; do
  start_replica $i
  pids+=($!)
  replica[$!]=hastate-$i
done
echo "demo: three replicas on 127.0.0.2-4 (:9777 agent, :9778 HTTP, :9779 raft; logs: $demo/hastate-*.log):" \
  "hastate-0 pid $(cat "$demo/hastate-0.pid"), hastate-1 pid $(cat "$demo/hastate-1.pid"), hastate-2 pid $(cat "$demo/hastate-2.pid")"
for _ in $(seq 150); do
  curl -fs -o /dev/null http://127.0.0.2:9778/-/readiness && break
  sleep 0.2
done

if [ -x "$haproxy" ]; then
  cat >"$demo/haproxy.cfg" <<CFG
global
    stats socket $demo/admin.sock mode 600 level admin
defaults
    mode tcp
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    timeout check 2s
# The "internal load balancer" in front of the three replicas: like a cloud
# load balancer, it health-checks each replica's /-/readiness.
listen hastate_agent
    bind 127.0.0.1:9777
    option httpchk GET /-/readiness
    default-server check port 9778 inter 500ms fall 1 rise 2
    server hastate-0 127.0.0.2:9777
    server hastate-1 127.0.0.3:9777
    server hastate-2 127.0.0.4:9777
listen hastate_http
    bind 127.0.0.1:9778
    mode http
    option httpchk GET /-/readiness
    default-server check inter 500ms fall 1 rise 2
    server hastate-0 127.0.0.2:9778
    server hastate-1 127.0.0.3:9778
    server hastate-2 127.0.0.4:9778
# The example backends' servers: HAProxy itself answers HTTP on 9881-9884.
# They are no replica, so a replica killed in the demo changes nothing for
# them: HAProxy keeps each server's state while the others answer.
frontend demo_servers
    mode http
    timeout http-request 5s
    bind 127.0.0.1:9881
    bind 127.0.0.1:9882
    bind 127.0.0.1:9883
    bind 127.0.0.1:9884
    http-request return status 200 content-type text/plain lf-string "demo server on port %[dst_port]\n"
# Example backends, each server's state and weight from hastate.
backend canary_web
    server web-1 127.0.0.1:9881 weight 100 check agent-check agent-addr 127.0.0.1 agent-port 9777 agent-inter 2s agent-send "canary_web/web-1\n"
    server web-2 127.0.0.1:9882 weight 100 check agent-check agent-addr 127.0.0.1 agent-port 9777 agent-inter 2s agent-send "canary_web/web-2\n"
backend canary_api
    server api-1 127.0.0.1:9883 weight 100 check agent-check agent-addr 127.0.0.1 agent-port 9777 agent-inter 2s agent-send "canary_api/api-1\n"
    server api-2 127.0.0.1:9884 weight 100 check agent-check agent-addr 127.0.0.1 agent-port 9777 agent-inter 2s agent-send "canary_api/api-2\n"
CFG
  setsid "$haproxy" -db -f "$demo/haproxy.cfg" >"$demo/haproxy.log" 2>&1 &
  haproxy_pid=$!
  echo $! >"$demo/haproxy.pid"
  pids+=($!)
  echo "demo: HAProxy $("$haproxy" -v | head -1 | awk '{print $3}') polls through 127.0.0.1:9777 (config: $demo/haproxy.cfg)"
  cat >"$demo/show-stat" <<SH
#!/usr/bin/env bash
# HAProxy's view of the example servers: proxy, server, status, weight.
if command -v socat >/dev/null; then echo 'show stat' | socat - $demo/admin.sock
else python3 -c "import socket;s=socket.socket(socket.AF_UNIX);s.connect('$demo/admin.sock');s.send(b'show stat\\n');print(s.makefile().read())"
fi | cut -d, -f1,2,18,19 | grep canary
SH
  chmod +x "$demo/show-stat"
  stat="$demo/show-stat"
  addr=http://127.0.0.1:9778
else
  echo "demo: HAProxy not installed (sudo apt-get install -y haproxy); replicas answer directly on 127.0.0.2-4:9777"
  stat="(HAProxy not installed)"
  addr=http://127.0.0.2:9778
  # No HAProxy polls, so writes would be refused as typos: force them.
  force=" HASTATE_FORCE=true"
fi
agent=127.0.0.1:9777
[ -x "$haproxy" ] || agent=127.0.0.2:9777

cat <<TXT

hastate demo is running. In another shell:

  export CONSUL_HTTP_ADDR=127.0.0.1:8500 HASTATE_ADDR=$addr${force:-} PATH=$root/bin:$demo/bin:\$PATH
  hastate status                                   # desired state, answers, and how many HAProxy nodes were told
  hastate clear canary_web/web-2                   # undrain: the weight ramps 10% -> 100% over 60s (demo setting)
  hastate status canary_web                        # the ramp's progress and ETA
  hastate drain canary_web/web-1 --reason "try it" --for 2m   # back by itself in 2 minutes
  hastate wait canary_web/web-1 && $stat
  hastate precheck 'canary_*/*'                    # the deploy gate: exit 1, web-1 is drained
  hastate drain 'canary_*/*' --dry-run             # the canary drain: refused, api-1's own 50% would escape it (the dry run shows the transaction)
  hastate drain 'canary_*/*' --override --dry-run  # one key per canary backend, api-1's key cleared in the same transaction
  hastate weight 25% canary_api/api-2
  hastate probe canary_web/web-1 --addr $agent       # ask like HAProxy does
  curl -s $addr/v1/cluster                         # raft view; $addr/ is the status page, $addr/-/metrics the metrics
  $(printf '%-49s' "kill -9 $(cat "$demo/hastate-0.pid")")# kill replica hastate-0: the others keep answering, the gates name it
  sleep 2; hastate precheck canary_api/api-2       # exit 4: cannot confirm, replica hastate-0 unreachable
  $(printf "%-49s" "$root/scripts/demo.sh restart hastate-0")# start it again (Ctrl-C of the demo stops it too)
  hastate clear 'canary_*/*' canary_web/web-1 canary_api/api-1 canary_api/api-2 --force

  consul kv get -recurse hastate/                  # what hastate reads (consul: $demo/bin/consul)

Ctrl-C stops the demo (or, from another shell: scripts/demo.sh stop).
TXT
# A replica that dies is part of the demo (failover); Consul or HAProxy
# dying ends it.
declare -A name=([$consul_pid]=consul)
[ -n "$haproxy_pid" ] && name[$haproxy_pid]=haproxy
while true; do
  pid= status=0
  # (stderr: bash's own "Killed ..." notice; the line below says it)
  wait -n -p pid "${pids[@]}" 2>/dev/null || status=$?
  [ -n "$pid" ] || break
  if [ -n "${name[$pid]:-}" ]; then
    echo "demo: ${name[$pid]} exited unexpectedly; see $demo/${name[$pid]}.log"
    break
  fi
  r=${replica[$pid]}
  if [ -e "$demo/$r.restarting" ] || [ "$(cat "$demo/$r.pid" 2>/dev/null)" != "$pid" ]; then
    echo "demo: $r (pid $pid) stopped for a restart"
  else
    echo "demo: $r (pid $pid) exited (status $status); the other two keep answering. Start it again: scripts/demo.sh restart $r"
  fi
  alive=()
  for p in "${pids[@]}"; do [ "$p" = "$pid" ] || alive+=("$p"); done
  pids=("${alive[@]}")
done
