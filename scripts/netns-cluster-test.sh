#!/usr/bin/env bash
# Multi-host test: a controller and 4 workers in 2 islands, each worker in its own network
# namespace ("host") with its own address, joined by a bridge. Links between the islands (DCN)
# are shaped: a bandwidth cap (tc htb) and 2 ms of added latency each way (tc netem, or where the
# kernel lacks netem, pw-netdelay on an iptables NFQUEUE rule at each host's input).
# Checks the added latency, then runs Figure 2, the dispatch benchmark and the transfer benchmark
# across the hosts and checks DCN/ICI accounting. Every connection is TLS (the processes listen
# off loopback): mutual between the controller and workers, the bulk stream between the "machines"
# included; clients use PW_TLS_CA.
#
# Needs root, `ip netns` and veth/bridge links; exits 0 with "SKIP: ..." when they cannot be made.
# Usage: scripts/netns-cluster-test.sh [path/to/pw [path/to/pw-netdelay]]
set -uo pipefail
PW=$(readlink -f "${1:-build/bin/pw}")
NETDELAY=$(readlink -f "${2:-$(dirname "$PW")/pw-netdelay}")
DELAY_MS=2
TOKEN="netns-test-$$-$RANDOM"
BR=pwbr$$
NS=(pwh0-$$ pwh1-$$ pwh2-$$ pwh3-$$)
ADDR=(10.77.0.10 10.77.0.11 10.77.1.10 10.77.1.11)   # Island 0: 10.77.0.0/24, island 1: 10.77.1.0/24.
CTRL=10.77.0.1
DIR=$(mktemp -d)
PIDS=()

skip() { echo "SKIP: $*"; exit 0; }
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  sleep 0.3
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  for n in "${NS[@]}"; do ip netns del "$n" 2>/dev/null; done
  ip link del "$BR" 2>/dev/null
  rm -rf "$DIR"
}
trap cleanup EXIT
trap 'exit 1' INT TERM  # Runs cleanup too.

[ -x "$PW" ] || { echo "FAIL: $PW not built"; exit 1; }
[ "$(id -u)" -eq 0 ] || skip "not root: network namespaces cannot be made"
command -v ip >/dev/null || skip "iproute2 (ip) is not installed"
# What an earlier run killed outright (SIGKILL skips cleanup) left behind would clash with our
# addresses: its namespaces and bridge, named by its pid.
for n in $(ip netns list 2>/dev/null | grep -o '^pwh[0-9]-[0-9]*'); do
  kill -0 "${n#*-}" 2>/dev/null || ip netns del "$n" 2>/dev/null
done
for b in $(ip -o link show type bridge 2>/dev/null | grep -o 'pwbr[0-9]*'); do
  kill -0 "${b#pwbr}" 2>/dev/null || ip link del "$b" 2>/dev/null
done
ip netns add "${NS[0]}" 2>/dev/null || skip "ip netns add failed: namespaces cannot be made here"
ip link add "$BR" type bridge 2>/dev/null || skip "cannot create a bridge"
ip addr add "$CTRL/16" dev "$BR" && ip link set "$BR" up
for i in 0 1 2 3; do
  n=${NS[$i]}
  [ "$i" -eq 0 ] || ip netns add "$n" || skip "ip netns add $n failed"
  ip link add "v$i-$$" type veth peer name eth0 netns "$n" || skip "cannot create veth links"
  ip link set "v$i-$$" master "$BR" up
  ip netns exec "$n" ip addr add "${ADDR[$i]}/16" dev eth0
  ip netns exec "$n" ip link set eth0 up
  ip netns exec "$n" ip link set lo up
done

# Shape every host's traffic to and from the other island: a 200 Mbit/s cap on what it sends, and
# DELAY_MS on each packet one way (netem on what it sends; else pw-netdelay on what it receives:
# delaying at the sender would hold packets inside the sending socket's small-queue budget).
shaped="" delayed=0
for i in 0 1 2 3; do
  n=${NS[$i]}
  other=$([ "$i" -lt 2 ] && echo 10.77.1.0/24 || echo 10.77.0.0/24)
  ip netns exec "$n" tc qdisc add dev eth0 root handle 1: htb default 10 || skip "tc htb unavailable"
  ip netns exec "$n" tc class add dev eth0 parent 1: classid 1:10 htb rate 10gbit
  ip netns exec "$n" tc class add dev eth0 parent 1: classid 1:20 htb rate 200mbit ceil 200mbit
  if ip netns exec "$n" tc qdisc add dev eth0 parent 1:20 handle 20: netem delay ${DELAY_MS}ms \
      2>/dev/null; then
    shaped="200 Mbit/s + ${DELAY_MS} ms netem delay" delayed=1
  elif [ -x "$NETDELAY" ] &&
       ip netns exec "$n" iptables -A INPUT -s "$other" -j NFQUEUE --queue-num 1 \
         --queue-bypass; then
    ip netns exec "$n" "$NETDELAY" --queue 1 --delay-ms $DELAY_MS 2>"$DIR/netdelay-$i.log" &
    PIDS+=($!)
    # Until it has bound the queue, packets bypass it undelayed.
    for _ in $(seq 100); do
      grep -q "pw-netdelay: queue" "$DIR/netdelay-$i.log" && break
      sleep 0.05
    done
    grep -q "pw-netdelay: queue" "$DIR/netdelay-$i.log" ||
      { cat "$DIR/netdelay-$i.log"; echo "FAIL: pw-netdelay did not bind its queue"; exit 1; }
    shaped="200 Mbit/s + ${DELAY_MS} ms pw-netdelay delay" delayed=1
  else
    shaped="200 Mbit/s, no added latency (neither tc netem nor iptables NFQUEUE with pw-netdelay)"
  fi
  ip netns exec "$n" tc filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip dst "$other" \
    flowid 1:20 || skip "tc u32 filters unavailable"
done
echo "DCN links: $shaped"

export PW_TOKEN=$TOKEN PW_STATE_DIR=$DIR
CLUSTER_TOKEN="netns-cluster-$$-$RANDOM$RANDOM"  # The controller's and workers' only.
"$(dirname "$0")/tls-certs.sh" "$DIR/tls" "$CTRL" "${ADDR[@]}" 127.0.0.1 localhost ||
  { echo "FAIL: scripts/tls-certs.sh"; exit 1; }
TLS=(--tls-cert "$DIR/tls/cert.pem" --tls-key "$DIR/tls/key.pem" --tls-ca "$DIR/tls/ca.pem")
export PW_TLS_CA=$DIR/tls/ca.pem
PW_CLUSTER_TOKEN=$CLUSTER_TOKEN "$PW" controller --islands 2 --hosts-per-island 2 --devices-per-host 2 --listen "$CTRL:0" \
  "${TLS[@]}" --failure-timeout-ms 60000 --address-file "$DIR/addr" >"$DIR/controller.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 200); do [ -s "$DIR/addr" ] && break; sleep 0.05; done
ADDRESS=$(cat "$DIR/addr" 2>/dev/null) || { cat "$DIR/controller.log"; echo "FAIL: controller did not start"; exit 1; }
for i in 0 1 2 3; do
  PW_CLUSTER_TOKEN=$CLUSTER_TOKEN ip netns exec "${NS[$i]}" "$PW" worker --controller "$ADDRESS" --host "$i" --listen "${ADDR[$i]}:0" \
    "${TLS[@]}" --machine "netns-host-$i" >"$DIR/worker-$i.log" 2>&1 &
  PIDS+=($!)
done
alive_hosts() {
  "$PW" status --cluster "$ADDRESS" --json 2>/dev/null |
    python3 -c 'import json,sys; print(sum(h["alive"] for h in json.load(sys.stdin)["hosts"]))' 2>/dev/null
}
for _ in $(seq 300); do [ "$(alive_hosts)" = 4 ] && break; sleep 0.1; done
"$PW" status --cluster "$ADDRESS" || { tail "$DIR"/*.log; echo "FAIL: status"; exit 1; }
[ "$(alive_hosts)" = 4 ] || { tail "$DIR"/*.log; echo "FAIL: the 4 workers did not all join"; exit 1; }

# The added latency is in effect: a TCP connect (one round trip) from host 0 to a worker in the
# other island takes at least 2 x DELAY_MS (its island peer's is printed beside it).
if [ "$delayed" = 1 ]; then
  "$PW" status --cluster "$ADDRESS" --json >"$DIR/hosts.json"
  ip netns exec "${NS[0]}" python3 - "$DIR/hosts.json" "$DELAY_MS" <<'PY' || exit 1
import json, socket, sys, time
hosts = {h["host"]: h["address"].rsplit(":", 1) for h in json.load(open(sys.argv[1]))["hosts"]}
delay_ms = float(sys.argv[2])
def connect_ms(addr):
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        socket.create_connection((addr[0], int(addr[1])), timeout=5).close()
        best = min(best, (time.perf_counter() - t) * 1e3)
    return best
ici, dcn = connect_ms(hosts[1]), connect_ms(hosts[2])
print(f"TCP connect from host 0: to host 1 (same island) {ici:.2f} ms, "
      f"to host 2 (other island) {dcn:.2f} ms")
if dcn < 2 * delay_ms:
    sys.exit(f"FAIL: a round trip between islands took {dcn:.2f} ms, "
             f"less than 2 x {delay_ms} ms of added latency")
PY
fi

# Unauthenticated calls are refused on a non-loopback address.
if PW_TOKEN= "$PW" example figure2 --cluster "$ADDRESS" >/dev/null 2>"$DIR/noauth.err"; then
  echo "FAIL: a call without the token was accepted"; exit 1
fi
grep -q UNAUTHENTICATED "$DIR/noauth.err" || { cat "$DIR/noauth.err"; echo "FAIL: expected UNAUTHENTICATED"; exit 1; }
# A client without the CA (plaintext) does not get through, and is told why.
if PW_TLS_CA= timeout 60 "$PW" example figure2 --cluster "$ADDRESS" >/dev/null 2>"$DIR/plain.err"; then
  echo "FAIL: a plaintext client was served"; exit 1
fi
grep -q PW_TLS_CA "$DIR/plain.err" || { cat "$DIR/plain.err"; echo "FAIL: expected a hint at PW_TLS_CA"; exit 1; }

out=$(timeout 300 "$PW" example figure2 --cluster "$ADDRESS") || { tail "$DIR"/*.log; echo "FAIL: figure2"; exit 1; }
[ "$out" = "(array([3., 5.]), array([2., 4.]))" ] || { echo "FAIL: figure2 printed $out"; exit 1; }
echo "figure2 across 4 namespaced hosts: $out"
timeout 300 "$PW" bench dispatch --cluster "$ADDRESS" --chain 16 --min-seconds 0.2 --json >"$DIR/dispatch.json" \
  || { tail "$DIR"/*.log; echo "FAIL: dispatch bench"; exit 1; }
python3 - "$DIR/dispatch.json" <<'PY' || exit 1
import json, sys
j = json.load(open(sys.argv[1]))
s = j["summary"]
print("dispatch bench across namespaced hosts:", {k: round(v, 3) if isinstance(v, float) else v for k, v in s.items()})
assert j["results"] and all(r["computations_per_second"] > 0 for r in j["results"])
PY
# Transfers through the shaped links complete, arrive intact (the bench checks the bytes), and
# the workers count exactly the bytes moved, on the right link.
timeout 300 "$PW" bench transfer --cluster "$ADDRESS" --sizes 1048576,16777216 --rounds 1 --min-seconds 0 \
  --json >"$DIR/transfer.json" 2>"$DIR/transfer.err" ||
  { tail "$DIR"/*.log "$DIR/transfer.err"; echo "FAIL: transfer bench"; exit 1; }
python3 - "$DIR/transfer.json" <<'PY' || exit 1
import json, sys
results = json.load(open(sys.argv[1]))["results"]
for r in results:
    print(f"transfer {r['path']} {r['bytes']} B: {r['pathways_bytes_per_second'] / 1e6:.1f} MB/s "
          f"(resident {r['baseline_bytes_per_second'] / 1e6:.1f}); "
          f"moved {r['moved_bytes']} B, counted {r['counted_bytes']} B")
    assert r["moved_bytes"] > 0 and r["counted_bytes"] == r["moved_bytes"], r
assert {r["path"] for r in results} == {"ici", "dcn"}, results
PY
"$PW" status --cluster "$ADDRESS" --json >"$DIR/status.json"
python3 - "$DIR/status.json" "$shaped" <<'PY' || exit 1
import json, sys
s = json.load(open(sys.argv[1]))
print(f"transfers over {sys.argv[2]} DCN links: DCN {s['dcn_bytes_received']} B, ICI {s['ici_bytes_received']} B")
assert all(h["alive"] for h in s["hosts"]), s["hosts"]
assert s["dcn_bytes_received"] > 0, "no DCN transfer was counted"
assert {h["address"].rsplit(":", 1)[0] for h in s["hosts"]} == {"10.77.0.10", "10.77.0.11", "10.77.1.10", "10.77.1.11"}
PY
echo "PASS"
