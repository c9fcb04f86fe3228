#!/usr/bin/env bash
# A small cluster of hosts on this machine, for MPI over TCP: each host is a network namespace
# with its own address and hostname, joined to the others through a bridge by a veth pair whose
# two ends can be shaped to a rate (tc tbf). `run` starts mpirun across the hosts with Open
# MPI's TCP transport, then removes everything it created, also when the job fails, times out
# or the script is killed (INT, TERM, HUP).
#
#   cluster.sh run [--hosts H] [--slots S] [--rate RATE] [--name NAME] [--timeout SECS]
#                  [--share-cores] -- PROGRAM [ARGS...]
#       Runs `mpirun -np H*S` (S ranks per host, ranks filled host by host) with PROGRAM.
#       RATE is a tc rate (500mbit, 1gbit, 10gbit) or `none` (the default): every host's link
#       gets it in both directions. NAME (at most 10 characters, default rn<pid>) prefixes
#       everything created: namespaces NAMEh0.. (and NAMEc, where mpirun runs), the bridge
#       NAMEb, and each host's link as NAMEv0.. on the bridge's side (`ip link set NAMEv1
#       down` cuts host 1 off). The job sees RTP_NET_NAME and RTP_NET_HOSTS. With SECS, a job
#       still running then is killed and the script exits 124. Each host gets its share of
#       the machine's cores (see `agent`); with --share-cores every host may run on every
#       core. Extra mpirun options go in MPIRUN_ARGS.
#   cluster.sh agent HOST COMMAND...
#       Open MPI's rsh agent: runs COMMAND (a shell command line, as ssh would) inside HOST's
#       namespace, with HOST as its hostname.
#   cluster.sh clean [NAME]
#       Removes what a killed run left behind (every cluster, or those named NAME).
#
# Needs root, iproute2 (ip, tc), util-linux (unshare) and Open MPI. netem is not in this
# machine's kernel, so links have a rate but no added delay.
set -euo pipefail
SELF=$(readlink -f "$0")

die() { echo "cluster.sh: $*" >&2; exit 2; }

# Kills every process inside the cluster's namespaces, then deletes them and the bridge.
teardown() {
  local name=$1 ns pids
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${name}(h[0-9]+|c)$" || true); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null || true
    ip netns delete "$ns" 2>/dev/null || true
  done
  ip link delete "${name}b" 2>/dev/null || true
}

case "${1:-}" in
  agent)
    shift
    host=${1:?agent: no host}; shift
    # The hostfile names hosts by namespace; Open MPI passes the remote command line as words.
    ip netns list | awk '{print $1}' | grep -qx "$host" || die "agent: no namespace $host"
    # The hosts share this machine's cores: host h gets cores h, h+H, h+2H.. (one core,
    # h mod cores, where there are more hosts than cores), and its ranks inherit them.
    index=${host##*h} count=${RTP_NET_HOSTS:-1} cpus=$(nproc)
    if [ "${RTP_NET_SHARE_CORES:-0}" = 1 ]; then
      cores=0-$(( cpus - 1 ))
    elif [ "$count" -le "$cpus" ]; then
      cores=$(seq -s, "$index" "$count" $(( cpus - 1 )))
    else
      cores=$(( index % cpus ))
    fi
    exec ip netns exec "$host" unshare --uts taskset -c "$cores" sh -c "hostname $host && $*"
    ;;
  clean)
    # A cluster is a bridge NAMEb beside a namespace NAMEc or NAMEh0.
    for bridge in $(ip -o link show type bridge | awk -F': ' '{print $2}' | sed -n 's/b$//p'); do
      [ -n "${2:-}" ] && [ "$bridge" != "$2" ] && continue
      ip netns list | awk '{print $1}' | grep -qxE "${bridge}(c|h0)" || continue
      teardown "$bridge" && echo "removed cluster $bridge"
    done
    exit 0
    ;;
  run) shift ;;
  *) sed -n '2,26p' "$SELF" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac

hosts=2 slots=1 rate=none name="rn$(( $$ % 100000 ))" timeout=0 share=0
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts=$2; shift 2 ;;
    --slots) slots=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --share-cores) share=1; shift ;;
    --) shift; break ;;
    *) die "unknown option $1 (see cluster.sh without arguments)" ;;
  esac
done
[ $# -gt 0 ] || die "no program to run (cluster.sh run [options] -- PROGRAM [ARGS...])"
[ "$(id -u)" = 0 ] || die "needs root (network namespaces)"
[ "${#name}" -le 10 ] || die "--name $name is longer than 10 characters (interface names take 15)"
[[ "$hosts" =~ ^[1-9][0-9]?$ && "$slots" =~ ^[1-9][0-9]*$ ]] || die "--hosts 1..99 and --slots >= 1"
[[ "$timeout" =~ ^[0-9]+$ ]] || die "--timeout takes whole seconds"
[[ "$SELF" != *" "* ]] || die "the script's path must not hold spaces (Open MPI splits its agent's name)"
for tool in ip tc unshare mpirun; do
  command -v $tool >/dev/null || die "$tool is missing (apt-get install iproute2 util-linux openmpi-bin)"
done
ip netns list | awk '{print $1}' | grep -qE "^${name}h[0-9]+$" && die "a cluster named $name exists (cluster.sh clean $name)"

# A /24 no route of this machine uses yet.
net=""
for i in $(seq 0 199); do
  candidate="10.213.$(( ($$ + i) % 200 + 20 ))"
  if [ -z "$(ip route show "$candidate.0/24" 2>/dev/null)" ]; then net=$candidate; break; fi
done
[ -n "$net" ] || die "no free 10.213.x.0/24 subnet"

job=""
finish() {
  local status=$?
  trap - EXIT INT TERM HUP
  if [ -n "$job" ] && kill -0 "$job" 2>/dev/null; then
    kill -TERM "$job" 2>/dev/null || true
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$job" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$job" 2>/dev/null || true
  fi
  teardown "$name"
  [ -n "${hostfile:-}" ] && rm -f "$hostfile"
  exit "$status"
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# tc rate, and a burst of 2 ms at that rate but at least 256 KiB: veth hands tbf packets of up
# to 64 KiB (GSO), and a bucket smaller than a packet drops it.
shape() {
  local netns=$1 dev=$2
  [ "$rate" = none ] && return 0
  local burst=$(( $(tc_bits "$rate") / 8 / 500 ))
  [ "$burst" -lt 262144 ] && burst=262144
  if [ -n "$netns" ]; then
    ip netns exec "$netns" tc qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" latency 200ms
  else
    tc qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" latency 200ms
  fi
}
tc_bits() {
  local r=${1,,} n unit
  n=${r%%[a-z]*}; unit=${r#"$n"}
  case "$unit" in
    kbit) echo $(( ${n%.*} * 1000 )) ;;
    mbit) echo $(( ${n%.*} * 1000000 )) ;;
    gbit) awk -v n="$n" 'BEGIN { printf "%d", n * 1e9 }' ;;
    *) die "--rate $1: give kbit, mbit or gbit" ;;
  esac
}
[ "$rate" = none ] || tc_bits "$rate" >/dev/null

# A namespace NAME$1 on the bridge, through NAMEv$2 on the bridge's side and eth0 inside, at
# address $3.
add_host() {
  local ns="${name}$1" link="${name}v$2"
  ip netns add "$ns"
  ip link add "$link" type veth peer name eth0 netns "$ns"
  ip link set "$link" master "${name}b" up
  ip -n "$ns" addr add "$3/24" dev eth0
  ip -n "$ns" link set lo up
  ip -n "$ns" link set eth0 up
}

ip link add "${name}b" type bridge
ip link set "${name}b" up
# The control host, where mpirun runs: on the bridge like the others, with an unshaped link.
# Its TCP gives up on an unacknowledged segment after about 13 s (tcp_retries2 5; Linux's
# default takes about 15 minutes), so that mpirun learns soon that a host is cut off. The
# hosts keep the default.
add_host c c "$net.254"
ip netns exec "${name}c" sysctl -qw net.ipv4.tcp_retries2=5
hostfile=$(mktemp /tmp/cluster-hostfile.XXXXXX)
for h in $(seq 0 $(( hosts - 1 ))); do
  add_host "h$h" "$h" "$net.$(( h + 1 ))"
  # Both directions of host h's link: its uplink inside the namespace, its downlink on the
  # bridge's side.
  shape "${name}h$h" eth0
  shape "" "${name}v$h"
  echo "${name}h$h slots=$slots" >>"$hostfile"
done
echo "cluster $name: $hosts host(s) x $slots rank(s) on $net.0/24, links at $rate" >&2

export RTP_NET_NAME=$name RTP_NET_HOSTS=$hosts RTP_NET_SHARE_CORES=$share OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# mpirun reaches each host's daemon over the bridge; ranks on one host share memory (vader),
# ranks on different hosts talk TCP on the cluster's subnet.
# Each host's daemon is pinned to the host's cores (see `agent`), and ranks are not bound
# again: every daemon would bind its first rank to core 0.
# A daemon's connection that is silent is probed by TCP keepalive: mpirun gives up on it after
# about 16 s (Open MPI's default takes 8 minutes). Either way a job whose host is cut off ends
# after its ranks' own peer timeouts have named what they were waiting for.
# `timeout` (coreutils) ends a job that runs past --timeout (0: never) and exits 124.
# shellcheck disable=SC2086
timeout --kill-after=10 "$timeout" ip netns exec "${name}c" mpirun --allow-run-as-root --oversubscribe --bind-to none \
  -np $(( hosts * slots )) --hostfile "$hostfile" --mca plm_rsh_agent "$SELF agent" --mca plm_rsh_no_tree_spawn 1 \
  --mca btl self,vader,tcp --mca btl_tcp_if_include "$net.0/24" --mca oob_tcp_if_include "$net.0/24" \
  --mca oob_tcp_keepalive_time 10 --mca oob_tcp_keepalive_intvl 2 --mca oob_tcp_keepalive_probes 3 \
  ${MPIRUN_ARGS:-} "$@" &
job=$!
set +e
wait "$job"
status=$?
set -e
[ "$status" = 124 ] && echo "cluster.sh: the job ran past --timeout $timeout s and was killed" >&2
exit "$status"
