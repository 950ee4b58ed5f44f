#!/usr/bin/env bash
# make demo: a Consul server that keeps its data, three hastate replicas (one
# raft cluster), three HAProxy nodes that poll them from their own loopback
# addresses through a load balancer each, a load balancer in front of the
# replicas for the operator commands, and Debian's Prometheus scraping every
# HAProxy exporter and every replica. Ctrl-C stops everything; the next
# `make demo` resumes where this one stopped.
#
#   scripts/demo.sh                      # run the demo (make demo): resumes the
#                                        # earlier demo's data in .demo, if any
#   scripts/demo.sh --reset              # run the demo from scratch (make demo-reset):
#                                        # the earlier demo's data and logs are removed
#   scripts/demo.sh reset                # only remove the earlier demo's data and logs
#   scripts/demo.sh stop                 # stop a demo, or what is left of one
#                                        # (its pids are in .demo/*.pid)
#   scripts/demo.sh restart hastate-0    # from another shell: restart a replica
#                                        # of the running demo (stop it if it
#                                        # runs, start it again); Ctrl-C of the
#                                        # demo stops it too
#   scripts/demo.sh consul stop|start    # from another shell: stop Consul (the
#                                        # demo keeps running and says what to
#                                        # look at), start it again (same data)
#
# Environment (the defaults are what `make demo` uses):
#   HASTATE_DEMO_DIR   where data, logs and pids live (.demo)
#   HASTATE_DEMO_NET   the first three octets of the loopback addresses
#                      (127.0.0): Consul, Prometheus and the load balancer on
#                      .1, the replicas on .2-.4, the HAProxy nodes on .11-.13
#   HASTATE_BIN        the hastate binary (bin/hastate, built by make)
#   CONSUL_BIN, HAPROXY_BIN, PROMETHEUS_BIN
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
demo=${HASTATE_DEMO_DIR:-$root/.demo}
case $demo in /*) ;; *) demo=$root/$demo ;; esac
bin=${HASTATE_BIN:-$root/bin/hastate}
net=${HASTATE_DEMO_NET:-127.0.0}
if ! [[ $net =~ ^127\.[0-9]{1,3}\.[0-9]{1,3}$ ]]; then
  echo "demo: HASTATE_DEMO_NET=$net: want three octets of a loopback address, e.g. 127.0.0" >&2
  exit 2
fi
lb=$net.1 # Consul, Prometheus, the load balancer of the replicas, the example servers
replica_ip() { echo "$net.$(($1 + 2))"; }
node_ip() { echo "$net.$(($1 + 10))"; } # HAProxy node 1..3
nodes=(1 2 3)
peers="hastate-0=$(replica_ip 0):9779,hastate-1=$(replica_ip 1):9779,hastate-2=$(replica_ip 2):9779"
consul_addr=$lb:8500
prom_addr=$lb:9090

# Every process runs in a session of its own (setsid): Ctrl-C reaches only
# this script, whose cleanup stops them in order. Each is disowned once
# started: bash would otherwise print its own job line ("line 661: 22329
# Killed ...") for a replica killed in the demo, at whichever command it
# happened to reap it; the watch loop at the end says it in words instead. Sharing the terminal's
# process group, Consul got the SIGINT too and exited first, and the demo
# said "consul exited unexpectedly" before "stopping".

# say: a line for the operator, also kept in $demo/demo.log. A failed
# write must not stop the cleanup (SIGPIPE is ignored there), or the
# processes would be left running without a parent.
say() {
  printf '%s\n' "$*" 2>/dev/null || true
  [ -d "$demo" ] && printf '%s %s\n' "$(date -u +%FT%TZ)" "$*" >>"$demo/demo.log" 2>/dev/null || true
}

# say_stopping: a line of the cleanup. Under `make demo | tee log` the
# Ctrl-C that starts it kills tee too, so whatever goes to the pipe is
# lost (written before tee died, or refused after): when the output is not
# the terminal, the line also goes to the terminal the Ctrl-C came from.
say_stopping() {
  if [ ! -t 1 ] && { : >/dev/tty; } 2>/dev/null; then
    printf '%s\n' "$*" >/dev/tty 2>/dev/null || true
  fi
  say "$*"
}

# log_header name what: a line that starts this run's part of a log (the
# logs are kept across runs).
log_header() { printf '==> demo %s: %s %s\n' "$(date -u +%FT%TZ)" "$1" "$2" >>"$demo/$1.log"; }

# start_replica i: start replica hastate-i in the background; its pid goes
# to $demo/hastate-i.pid (the demo's cleanup reads it, so a restarted
# replica is stopped with the rest).
start_replica() {
  local i=$1 ip
  ip=$(replica_ip "$1")
  log_header hastate-$i start
  CONSUL_HTTP_ADDR=$consul_addr HASTATE_PEERS=$peers setsid "$bin" serve --node-id hastate-$i --data-dir "$demo/hastate-$i" \
    --agent-addr "$ip:9777" --http-addr "$ip:9778" --raft-addr "$ip:9779" --raft-advertise "$ip:9779" \
    --ramp-duration 60s --ramp-interval 5s \
    --log-format json >>"$demo/hastate-$i.log" 2>&1 </dev/null &
  echo $! >"$demo/hastate-$i.pid"
  disown "$!" # no job line ("Killed") when it dies: the watch loop names it
}

# start_consul: a single Consul server with its data in $demo/consul (not a
# -dev agent: it keeps the KV across a stop, as a real one does).
start_consul() {
  local c
  c=$(realpath "$demo/bin/consul")
  log_header consul start
  setsid "$c" agent -server -bootstrap-expect=1 -node demo -data-dir "$demo/consul" \
    -bind "$lb" -client "$lb" -advertise "$lb" -dns-port -1 -grpc-port -1 -ui \
    -hcl 'disable_update_check = true' -hcl 'performance { raft_multiplier = 1 }' \
    >>"$demo/consul.log" 2>&1 </dev/null &
  echo $! >"$demo/consul.pid"
  disown "$!" # no job line ("Killed") when it dies: the watch loop names it
}

# consul_ready: Consul has a leader and answers a KV read.
consul_ready() {
  local leader code
  leader=$(curl -fs --max-time 2 "http://$consul_addr/v1/status/leader" 2>/dev/null) || return 1
  [ -n "$leader" ] && [ "$leader" != '""' ] || return 1
  code=$(curl -s --max-time 2 -o /dev/null -w '%{http_code}' "http://$consul_addr/v1/kv/hastate/?keys&consistent" 2>/dev/null)
  [ "$code" = 200 ] || [ "$code" = 404 ]
}

# wait_consul: up to 30s for consul_ready; 1 if Consul exited or never got ready.
wait_consul() {
  local pid
  pid=$(cat "$demo/consul.pid")
  for _ in $(seq 150); do
    consul_ready && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.2
  done
  return 1
}

# stop_pid pid [seconds]: SIGTERM, wait (default 30s), then SIGKILL.
stop_pid() {
  local pid=$1 n=$((${2:-30} * 10))
  kill -TERM "$pid" 2>/dev/null || return 0
  while kill -0 "$pid" 2>/dev/null && [ $((n--)) -gt 0 ]; do sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}

# names: every process of a demo, in the order to stop them: the HAProxy
# nodes, the load balancer, Prometheus, the replicas, Consul last.
names=(haproxy-1 haproxy-2 haproxy-3 haproxy-lb prometheus hastate-2 hastate-1 hastate-0 consul)

# pid_of name: the pid of a process of this demo that still runs, from its
# pid file. A pid whose command line does not name this demo's directory
# (reused since, or a zombie) is none.
pid_of() {
  local p
  p=$(cat "$demo/$1.pid" 2>/dev/null) || return 1
  [[ $p =~ ^[0-9]+$ ]] && kill -0 "$p" 2>/dev/null || return 1
  grep -qaF -- "$demo/" "/proc/$p/cmdline" 2>/dev/null || return 1
  echo "$p"
}

# demo_pids: "name pid" for each process of a demo (this one or an earlier
# one) that still runs, in the order to stop them.
demo_pids() {
  local n p
  for n in "${names[@]}"; do
    p=$(pid_of "$n") && echo "$n $p"
  done
  return 0
}

# running_demo: the pid of the demo script that runs, if one does.
running_demo() {
  local d
  d=$(cat "$demo/demo.pid" 2>/dev/null) && kill -0 "$d" 2>/dev/null && grep -qa demo.sh "/proc/$d/cmdline" 2>/dev/null && echo "$d"
}

# outage_help: what to look at while Consul is down.
outage_help() {
  cat <<TXT
  While Consul is down, look at (in the shell with the demo's exports):
    hastate probe canary_web/web-2 --addr $lb:9777    # answers unchanged: every replica serves the last state it mirrored
    hastate drain canary_api/api-2 --reason test          # refused (exit 4), naming Consul at $consul_addr: nothing written
    hastate status                                        # says since when Consul cannot be read
    http://$lb:9778/                                   # the status page's red banner
    curl -s http://$(replica_ip 0):9778/-/metrics | grep -E '^hastate_kv_(reachable|sync_age_seconds) '   # the alert's metrics
    http://$prom_addr/alerts                           # HastateKVSyncStale: pending, firing after 120s + 1m
    scripts/demo.sh consul start                          # Consul again, same data: writes work, the leader catches up
TXT
}

case "${1:-}" in
stop)
  # The demo script first, if it runs: its cleanup stops the rest in order.
  if d=$(running_demo); then
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
  echo "demo: stopped (data and logs kept in $demo; make demo resumes, make demo-reset starts afresh)"
  exit 0
  ;;
reset)
  if d=$(running_demo) || [ -n "$(demo_pids)" ]; then
    echo "demo: a demo runs${d:+ (pid $d)}: stop it first (Ctrl-C, or scripts/demo.sh stop)" >&2
    exit 1
  fi
  rm -rf "$demo"
  echo "demo: removed $demo (the next make demo starts afresh)"
  exit 0
  ;;
restart)
  r=${2:-}
  if ! [[ $r =~ ^hastate-([012])$ ]]; then
    echo "usage: scripts/demo.sh restart hastate-0|hastate-1|hastate-2" >&2
    exit 2
  fi
  i=${BASH_REMATCH[1]}
  if ! running_demo >/dev/null; then
    echo "demo: no demo is running (start one with make demo)" >&2
    exit 1
  fi
  touch "$demo/hastate-$i.restarting"
  if old=$(pid_of "hastate-$i"); then
    echo "demo: stopping $r (pid $old)"
    stop_pid "$old"
  fi
  start_replica "$i"
  rm -f "$demo/hastate-$i.restarting"
  pid=$(cat "$demo/hastate-$i.pid")
  for _ in $(seq 150); do
    curl -fs -o /dev/null "http://$(replica_ip "$i"):9778/-/readiness" && break
    kill -0 "$pid" 2>/dev/null || {
      echo "demo: $r (pid $pid) exited at start; see $demo/$r.log" >&2
      exit 1
    }
    sleep 0.2
  done
  echo "demo: $r restarted (pid $pid; log: $demo/$r.log); Ctrl-C of the demo stops it too"
  exit 0
  ;;
consul)
  if ! running_demo >/dev/null; then
    echo "demo: no demo is running (start one with make demo)" >&2
    exit 1
  fi
  case "${2:-}" in
  stop)
    if ! p=$(pid_of consul); then
      echo "demo: Consul is not running (start it with: scripts/demo.sh consul start)"
      exit 0
    fi
    touch "$demo/consul.stopped"
    echo "demo: stopping Consul (pid $p); its data stays in $demo/consul"
    stop_pid "$p"
    echo "demo: Consul stopped; the demo keeps running."
    outage_help
    exit 0
    ;;
  start)
    if p=$(pid_of consul); then
      echo "demo: Consul already runs (pid $p)"
      exit 0
    fi
    start_consul
    if ! wait_consul; then
      echo "demo: Consul did not get ready within 30s; see $demo/consul.log" >&2
      exit 1
    fi
    rm -f "$demo/consul.stopped"
    echo "demo: Consul started again (pid $(cat "$demo/consul.pid"); same data); hastate status shows the replicas in sync within seconds"
    exit 0
    ;;
  *)
    echo "usage: scripts/demo.sh consul stop|start" >&2
    exit 2
    ;;
  esac
  ;;
--reset) reset=1 ;;
"") reset= ;;
*)
  echo "usage: scripts/demo.sh [--reset | reset | stop | restart hastate-0|hastate-1|hastate-2 | consul stop|start]" >&2
  exit 2
  ;;
esac

consul=${CONSUL_BIN:-$(scripts/ensure-consul.sh)}
haproxy=${HAPROXY_BIN:-$(command -v haproxy || echo /usr/sbin/haproxy)}
prometheus=${PROMETHEUS_BIN:-$(command -v prometheus || echo /usr/bin/prometheus)}
if [ ! -x "$bin" ]; then
  echo "demo: no hastate binary at $bin: run make demo (it builds one), or set HASTATE_BIN" >&2
  exit 1
fi

# Every address the demo listens on: a previous demo left running (its
# script killed) holds them.
addrs=("$lb:8500" "$lb:8300" "$lb:8301" "$lb:8302" "$lb:9777" "$lb:9778" "$lb:9090" "$lb:9881" "$lb:9882" "$lb:9883" "$lb:9884")
for i in 0 1 2; do for p in 9777 9778 9779; do addrs+=("$(replica_ip $i):$p"); done; done
for n in "${nodes[@]}"; do for p in 9777 8404 8080 8081; do addrs+=("$(node_ip "$n"):$p"); done; done
# Asked of the kernel (ss), not by connecting: a connection to a running
# replica's agent port that sends nothing counts there as a malformed
# request (hastate_agent_errors_total, HastateAgentErrorRateHigh). Without
# ss, every port but the agent ports is tried (a replica's HTTP port tells
# that it runs).
busy=()
if command -v ss >/dev/null; then
  listening=$(ss -Hltn 2>/dev/null | awk '{print $4}')
  for a in "${addrs[@]}"; do
    if grep -qxF -e "$a" -e "*:${a#*:}" -e "0.0.0.0:${a#*:}" -e "[::]:${a#*:}" <<<"$listening"; then busy+=("$a"); fi
  done
else
  for a in "${addrs[@]}"; do
    [ "${a#*:}" = 9777 ] && continue
    if (exec 3<>"/dev/tcp/${a%:*}/${a#*:}") 2>/dev/null; then busy+=("$a"); fi
  done
fi
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
if d=$(running_demo); then
  echo "demo: a demo already runs from $demo (pid $d); stop it first (scripts/demo.sh stop)" >&2
  exit 1
fi

# Resume or start afresh. The replicas' raft state records which Consul
# cluster it mirrors, so it is kept only together with Consul's data.
if [ -n "$reset" ] && [ -e "$demo" ]; then
  rm -rf "$demo"
  mode="a fresh demo (--reset: the earlier demo's data and logs were removed)"
elif [ -d "$demo/consul" ]; then
  mode="resuming the demo of $(cat "$demo/started" 2>/dev/null || echo "an earlier run"): the same Consul data, raft data and answers (make demo-reset starts afresh)"
  resume=1
elif [ -e "$demo" ]; then
  rm -rf "$demo"/hastate-* "$demo/prometheus" "$demo/consul.stopped"
  mode="a fresh demo (no Consul data in $demo to resume; logs kept)"
else
  mode="a fresh demo"
fi
mkdir -p "$demo/bin"
[ -n "${resume:-}" ] || date -u +%FT%TZ >"$demo/started"
# consul on the PATH the demo prints, as `consul` (the cached build has
# its version in its name).
ln -sfn "$(realpath "$consul")" "$demo/bin/consul"
rm -f "$demo/consul.stopped" "$demo"/*.restarting

cleanup() {
  trap - INT TERM HUP PIPE EXIT
  trap '' PIPE INT
  set +e
  say_stopping ""
  say_stopping "demo: stopping..."
  local n p stop=()
  while read -r n p; do
    [ "$n" = consul ] || stop+=("$n:$p")
  done < <(demo_pids)
  # HAProxy, Prometheus and the replicas (also those restarted from
  # another shell, which are no children of this script) first, Consul last.
  for np in "${stop[@]}"; do kill -TERM "${np#*:}" 2>/dev/null; done
  for np in "${stop[@]}"; do stop_pid "${np#*:}"; done
  if p=$(pid_of consul); then stop_pid "$p"; fi
  wait 2>/dev/null
  rm -f "$demo/demo.pid"
  say_stopping "demo: stopped (data and logs kept in $demo: make demo resumes, make demo-reset starts afresh)"
  exit 0
}
trap cleanup INT TERM HUP PIPE EXIT
echo $$ >"$demo/demo.pid"
say "demo: $mode"

say "demo: starting Consul on $consul_addr, data in $demo/consul (log: $demo/consul.log)"
start_consul
if ! wait_consul; then
  say "demo: Consul did not get ready within 30s; see $demo/consul.log"
  exit 1
fi
export CONSUL_HTTP_ADDR=$consul_addr


for i in 0 1 2; do start_replica $i; done
say "demo: three replicas on $(replica_ip 0)-4 (:9777 agent, :9778 HTTP, :9779 raft; logs: $demo/hastate-*.log):" \
  "hastate-0 pid $(cat "$demo/hastate-0.pid"), hastate-1 pid $(cat "$demo/hastate-1.pid"), hastate-2 pid $(cat "$demo/hastate-2.pid")"
ready=
for _ in $(seq 150); do
  ready=
  for i in 0 1 2; do curl -fs -o /dev/null "http://$(replica_ip $i):9778/-/readiness" && ready+=$i; done
  [ ${#ready} = 3 ] && break
  sleep 0.2
done
[ ${#ready} = 3 ] || say "demo: not every replica is ready after 30s (ready: ${ready:-none}); see $demo/hastate-*.log"

have_haproxy=
if [ -x "$haproxy" ]; then
  have_haproxy=1
  # The load balancer in front of the replicas, for the operator commands
  # (HTTP) and manual probes (agent port), and the example backends'
  # servers: HAProxy itself answers HTTP on 9881-9884. They are no replica,
  # so a replica killed in the demo changes nothing for them.
  cat >"$demo/haproxy-lb.cfg" <<CFG
global
    stats socket $demo/haproxy-lb.sock mode 600 level admin
    nbthread 1
defaults
    mode tcp
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    timeout check 2s
# The "internal load balancer" in front of the three replicas: like a cloud
# load balancer, it health-checks each replica's /-/readiness.
listen hastate_agent
    bind $lb:9777
    option httpchk GET /-/readiness
    default-server check port 9778 inter 500ms fall 1 rise 2
    server hastate-0 $(replica_ip 0):9777
    server hastate-1 $(replica_ip 1):9777
    server hastate-2 $(replica_ip 2):9777
listen hastate_http
    bind $lb:9778
    mode http
    option httpchk GET /-/readiness
    default-server check inter 500ms fall 1 rise 2
    server hastate-0 $(replica_ip 0):9778
    server hastate-1 $(replica_ip 1):9778
    server hastate-2 $(replica_ip 2):9778
frontend demo_servers
    mode http
    timeout http-request 5s
    bind $lb:9881
    bind $lb:9882
    bind $lb:9883
    bind $lb:9884
    http-request return status 200 content-type text/plain lf-string "demo server on port %[dst_port]\n"
CFG
  # Three HAProxy nodes. Each reaches the replicas through a load balancer
  # section of its own, from its own address (source): a cloud internal
  # load balancer passes the client's address through, so every replica
  # sees each node as itself. Each publishes HAProxy's exporter on :8404
  # at that address, so Prometheus' instance label names the node the
  # replicas see polling.
  for n in "${nodes[@]}"; do
    ip=$(node_ip "$n") prev=
    {
      cat <<CFG
global
    stats socket $demo/haproxy-$n.sock mode 600 level admin
    nbthread 1
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    timeout check 2s
listen hastate_agent
    mode tcp
    bind $ip:9777
    option httpchk GET /-/readiness
    default-server check port 9778 inter 500ms fall 1 rise 2 source $ip
    server hastate-0 $(replica_ip 0):9777
    server hastate-1 $(replica_ip 1):9777
    server hastate-2 $(replica_ip 2):9777
frontend exporter
    bind $ip:8404
    http-request use-service prometheus-exporter if { path /metrics }
frontend web
    bind $ip:8080
    default_backend canary_web
frontend api
    bind $ip:8081
    default_backend canary_api
# Example backends, each server's state and weight from hastate.
CFG
      for b in canary_web:web-1:9881 canary_web:web-2:9882 canary_api:api-1:9883 canary_api:api-2:9884; do
        IFS=: read -r be s port <<<"$b"
        [ "$prev" = "$be" ] || printf 'backend %s\n    balance roundrobin\n' "$be"
        prev=$be
        printf '    server %s %s:%s weight 100 check inter 2s agent-check agent-addr %s agent-port 9777 agent-inter 2s agent-send "%s/%s\\n"\n' \
          "$s" "$lb" "$port" "$ip" "$be" "$s"
      done
    } >"$demo/haproxy-$n.cfg"
  done
  for h in lb "${nodes[@]}"; do
    log_header haproxy-$h start
    setsid "$haproxy" -db -f "$demo/haproxy-$h.cfg" >>"$demo/haproxy-$h.log" 2>&1 </dev/null &
    echo $! >"$demo/haproxy-$h.pid"
    disown "$!" # no job line ("Killed") when it dies: the watch loop names it
  done
  say "demo: HAProxy $("$haproxy" -v | head -1 | awk '{print $3}'): the load balancer of the replicas on $lb:9777 (agent) and $lb:9778 (HTTP);" \
    "three HAProxy nodes on $(node_ip 1), $(node_ip 2), $(node_ip 3) poll through it (configs: $demo/haproxy-*.cfg)"
  cat >"$demo/show-stat" <<SH
#!/usr/bin/env bash
# Each HAProxy node's view of the example servers: node, proxy, server, status, weight.
for n in ${nodes[*]}; do
  sock=$demo/haproxy-\$n.sock
  if command -v socat >/dev/null; then echo 'show stat' | socat - "\$sock"
  else python3 -c "import socket,sys;s=socket.socket(socket.AF_UNIX);s.connect(sys.argv[1]);s.send(b'show stat\\n');print(s.makefile().read())" "\$sock"
  fi | cut -d, -f1,2,18,19 | grep canary | sed "s/^/haproxy-\$n,/"
done
SH
  chmod +x "$demo/show-stat"
  stat="$demo/show-stat"
  addr=http://$lb:9778
  agent=$lb:9777
else
  say "demo: HAProxy not installed (sudo apt-get install -y haproxy); replicas answer directly on $(replica_ip 0)-4:9777"
  stat="(HAProxy not installed)"
  addr=http://$(replica_ip 0):9778
  agent=$(replica_ip 0):9777
  # No HAProxy polls, so writes would be refused as typos: force them.
  force=" HASTATE_FORCE=true"
fi

have_prom=
if [ -x "$prometheus" ]; then
  have_prom=1
  {
    cat <<CFG
# The demo's Prometheus: every HAProxy node's exporter (job haproxy, what
# verify, wait --idle, maint --drain-first and status --haproxy read) and
# every replica (job hastate, one target each), with hastate's alert rules.
global:
  scrape_interval: 2s
  scrape_timeout: 1s
  evaluation_interval: 2s
rule_files:
  - $root/deploy/prometheus/alerts.yaml
scrape_configs:
  - job_name: hastate
    metrics_path: /-/metrics
    static_configs:
      - targets: ['$(replica_ip 0):9778', '$(replica_ip 1):9778', '$(replica_ip 2):9778']
CFG
    if [ -n "$have_haproxy" ]; then
      cat <<CFG
  - job_name: haproxy
    metrics_path: /metrics
    static_configs:
      - targets: ['$(node_ip 1):8404', '$(node_ip 2):8404', '$(node_ip 3):8404']
CFG
    fi
  } >"$demo/prometheus.yml"
  log_header prometheus start
  setsid "$prometheus" --config.file="$demo/prometheus.yml" --storage.tsdb.path="$demo/prometheus" \
    --storage.tsdb.retention.time=1d --web.listen-address="$prom_addr" --log.level=warn \
    >>"$demo/prometheus.log" 2>&1 </dev/null &
  echo $! >"$demo/prometheus.pid"
  disown "$!" # no job line ("Killed") when it dies: the watch loop names it
  for _ in $(seq 100); do
    curl -fs -o /dev/null "http://$prom_addr/-/ready" && break
    kill -0 "$(cat "$demo/prometheus.pid")" 2>/dev/null || break
    sleep 0.2
  done
  say "demo: Prometheus on http://$prom_addr scrapes every HAProxy exporter and every replica, with hastate's alerts (log: $demo/prometheus.log)"
  promenv=" HASTATE_PROMETHEUS_URL=http://$prom_addr"
else
  say "demo: no Prometheus (sudo apt-get install -y prometheus, or scripts/ensure-promtool.sh as root): verify, wait --idle, maint --drain-first and status --haproxy cannot see HAProxy"
fi

# Ready to try: every HAProxy node polled every example server (HAProxy
# spreads its first checks over one inter, 2s), and Prometheus scraped
# every target once.
if [ -n "$have_haproxy" ]; then
  for _ in $(seq 75); do
    [ "$(curl -fs --max-time 2 "$addr/v1/state?scope=cluster" 2>/dev/null | grep -c "\"polled\": ${#nodes[@]},")" -ge 4 ] && break
    sleep 0.2
  done
fi
if [ -n "$have_prom" ]; then
  want=3
  [ -n "$have_haproxy" ] && want=$((3 + ${#nodes[@]}))
  for _ in $(seq 50); do
    curl -fs --max-time 2 "http://$prom_addr/api/v1/query?query=count(up==1)" 2>/dev/null | grep -q "\"$want\"\]" && break
    sleep 0.2
  done
fi

if [ -z "${resume:-}" ]; then
  # Seed an example: one drained server with a reason, one at 50%. Written
  # once the replicas are ready and HAProxy polled every server, so that
  # every guard holds and the meta keys name none lifted (without HAProxy
  # no server is known: --allow-unknown, the narrowest override).
  seed=(--by demo --addr "$addr")
  [ -n "$have_haproxy" ] || seed+=(--allow-unknown)
  "$bin" drain canary_web/web-2 --reason "demo: zonal maintenance" "${seed[@]}" >/dev/null ||
    say "demo: could not seed the drain of canary_web/web-2 (see above)"
  "$bin" weight 50% canary_api/api-1 "${seed[@]}" >/dev/null ||
    say "demo: could not seed canary_api/api-1 at 50% (see above)"
  [ -z "$have_haproxy" ] || "$bin" wait canary_web/web-2 canary_api/api-1 --addr "$addr" >/dev/null 2>&1 || true
fi

# The printed commands, kept in $demo/commands.txt to read again.
# scripts/demo.sh run from another shell finds this demo by these two.
[ "$demo" = "$root/.demo" ] || demoenv=" HASTATE_DEMO_DIR=$demo"
[ "$net" = 127.0.0 ] || demoenv+=" HASTATE_DEMO_NET=$net"
{
  cat <<TXT

hastate demo is running. In another shell:

  export CONSUL_HTTP_ADDR=$consul_addr HASTATE_ADDR=$addr${promenv:-}${force:-}${demoenv:-} PATH=$(dirname "$bin"):$demo/bin:\$PATH
  hastate status                                   # desired state, answers, and how many HAProxy nodes were told
  hastate clear canary_web/web-2                   # undrain: the weight ramps 10% -> 100% over 60s (demo setting)
  hastate status canary_web                        # the ramp's progress and ETA
  hastate drain canary_web/web-1 --reason "try it" --for 2m   # back by itself in 2 minutes
  hastate clear --expired                          # after those 2 minutes: status shows the key expired; this deletes it
  hastate wait canary_web/web-1 && $stat
  hastate precheck 'canary_*/*'                    # the deploy gate: exit 1, web-1 is drained
  hastate drain 'canary_*/*' --dry-run             # the canary drain: exit 1, refused: api-1's own 50% would escape it
  hastate drain 'canary_*/*' --override --dry-run  # one key per canary backend, api-1's key cleared in the same transaction
  hastate weight 25% canary_api/api-2
  hastate probe canary_web/web-1 --addr $agent       # ask like HAProxy does
TXT
  if [ -n "$have_prom" ] && [ -n "$have_haproxy" ]; then
    cat <<TXT
  hastate verify 'canary_*/*'                      # what each HAProxy reports (through Prometheus) against what it was told
  hastate status --haproxy canary_web              # HAProxy's own status, weight and sessions per node
  hastate wait canary_web/web-1 --idle             # told, and no session left on any HAProxy node
  hastate maint canary_api/api-2 --drain-first --idle-timeout 10s   # drain, wait until idle, then maint
  curl -s $(node_ip 1):8080/                         # traffic through HAProxy node 1 (web; :8081 api)
TXT
  fi
  cat <<TXT
  curl -s $addr/v1/cluster                         # raft view; $addr/ is the status page
  curl -s http://$(replica_ip 0):9778/-/metrics           # one replica's metrics (hastate-1: $(replica_ip 1), hastate-2: $(replica_ip 2))
TXT
  [ -n "$have_prom" ] && echo "  http://$prom_addr/alerts                      # Prometheus: the alerts, the targets, every metric"
  cat <<TXT
  $(printf '%-48s ' "kill -9 \$(cat $demo/hastate-0.pid)")# kill replica hastate-0: the others keep answering; commands name it in a note
  sleep 2; hastate precheck canary_api/api-2       # exit 0: the replicas that are up decide (a note names hastate-0)
  $(printf "%-48s " "$root/scripts/demo.sh restart hastate-0")# start it again (Ctrl-C of the demo stops it too)
  $(printf "%-48s " "$root/scripts/demo.sh consul stop")# a Consul outage: answers unchanged, writes refused; it says what to look at
  $(printf "%-48s " "$root/scripts/demo.sh consul start")# Consul back, with the same data
  hastate clear 'canary_*/*' canary_web/web-1 canary_api/api-1 canary_api/api-2 --force

  consul kv get -recurse hastate/                  # what hastate reads (consul: $demo/bin/consul; UI: http://$consul_addr/ui)

Ctrl-C stops the demo (or, from another shell: scripts/demo.sh stop); the next make demo resumes it,
with the same Consul data, raft data and answers (make demo-reset starts afresh). Logs: $demo/*.log.
(These commands are kept in $demo/commands.txt.)
TXT
} >"$demo/commands.txt"
cat "$demo/commands.txt"

# Watch every process of the demo: a replica, Consul or an HAProxy that
# stops is part of the demo (failover, an outage); each is named as it
# goes and comes back. The loop waits up to a second at a time, for a
# child that exits (reaped, so that its pid no longer counts) or a tick.
declare -A up
for n in "${names[@]}"; do pid_of "$n" >/dev/null && up[$n]=1 || up[$n]=; done
while true; do
  sleep 1 &
  wait -n 2>/dev/null || true
  for n in "${names[@]}"; do
    if p=$(pid_of "$n"); then
      if [ -z "${up[$n]}" ]; then
        say "demo: $n runs again (pid $p)"
        up[$n]=1
      fi
      continue
    fi
    [ -n "${up[$n]}" ] || continue
    up[$n]=
    case $n in
    hastate-*)
      if [ -e "$demo/$n.restarting" ]; then
        say "demo: $n stopped for a restart"
      else
        say "demo: $n exited; the other two keep answering. Start it again: scripts/demo.sh restart $n (log: $demo/$n.log)"
      fi
      ;;
    consul)
      if [ -e "$demo/consul.stopped" ]; then
        say "demo: Consul stopped (scripts/demo.sh consul stop); the demo keeps running on the last state. Start it again: scripts/demo.sh consul start"
      else
        say "demo: Consul exited (log: $demo/consul.log); the demo keeps running on the last state. Start it again: scripts/demo.sh consul start"
      fi
      outage_help | while IFS= read -r l; do say "$l"; done
      ;;
    *)
      say "demo: $n exited (log: $demo/$n.log); the rest keeps running. Ctrl-C and make demo start it again"
      ;;
    esac
  done
done
