#!/bin/bash
# Two hosts over TCP (docs/distributed.md, "Two hosts"): two network namespaces joined by a veth
# pair stand for two machines. mpirun runs in the first, its launcher starts the second rank's
# daemon in the second (through an rsh agent that enters the namespace), and Open MPI may use
# only TCP on the pair's subnet: nothing goes over shared memory. Needs root (CI runs as root).
#
#   tests/e2e/two_hosts.sh LOCKSTEP_BINARY
#
# 1. tiny-dp, 6 steps, by two ranks on two hosts: one process's chain and checkpoints.
# 2. The link cut mid-run: every rank stops within --comm-timeout, rank 0 naming rank 1 and its
#    host; with the link back, --resume on the two hosts continues to one process's chain.
set -euo pipefail
lockstep=$(realpath "$1")
[[ $(id -u) == 0 ]] || { echo "two_hosts.sh: needs root (network namespaces)" >&2; exit 1; }

tag=$$
ns0=lsa$tag ns1=lsb$tag
net=10.213.$((tag % 250)).0
work=$(mktemp -d /tmp/lockstep-two-hosts.XXXXXX)
cleanup() {
  pkill -9 -f "$work" 2>/dev/null || true
  ip netns del "$ns0" 2>/dev/null || true
  ip netns del "$ns1" 2>/dev/null || true
  rm -rf "/etc/netns/$ns0" "/etc/netns/$ns1" "$work"
}
trap cleanup EXIT

# The two "hosts": their own network stack, a veth pair between them, names in their own
# /etc/hosts (ip netns exec binds /etc/netns/NAME/hosts there).
ip netns add "$ns0"
ip netns add "$ns1"
ip link add "v0$tag" type veth peer name "v1$tag"
ip link set "v0$tag" netns "$ns0"
ip link set "v1$tag" netns "$ns1"
ip -n "$ns0" addr add "${net%.0}.1/24" dev "v0$tag"
ip -n "$ns1" addr add "${net%.0}.2/24" dev "v1$tag"
for n in 0 1; do
  ns=$([[ $n == 0 ]] && echo "$ns0" || echo "$ns1")
  ip -n "$ns" link set "v$n$tag" up
  ip -n "$ns" link set lo up
  mkdir -p "/etc/netns/$ns"
  printf '127.0.0.1 localhost\n%s.1 %s\n%s.2 %s\n' "${net%.0}" "$ns0" "${net%.0}" "$ns1" \
    > "/etc/netns/$ns/hosts"
done

# Open MPI's launcher agent: "agent HOST COMMAND..." runs COMMAND on HOST, here in the namespace
# of that name, with that host name.
cat > "$work/agent.sh" <<'EOF'
#!/bin/sh
host=$1
shift
exec ip netns exec "$host" unshare --uts sh -c "hostname $host; exec $*"
EOF
chmod +x "$work/agent.sh"
mpi() {  # mpi ARGS...: lockstep ARGS as rank 0 on ns0 and rank 1 on ns1, TCP only
  ip netns exec "$ns0" unshare --uts sh -c "hostname $ns0; exec mpirun --allow-run-as-root \
    --mca plm_rsh_agent $work/agent.sh --mca btl tcp,self \
    --mca btl_tcp_if_include ${net}/24 --mca oob_tcp_if_include ${net}/24 \
    -H $ns0:1,$ns1:1 -np 2 $lockstep $*"
}
fail() { echo "two_hosts.sh: FAIL: $*" >&2; exit 1; }

"$lockstep" data synth --out "$work/data" --seed 7 --tokens 200000 > /dev/null 2>&1
train=(train --config tiny-dp --data "$work/data" --no-progress)
"$lockstep" "${train[@]}" --out "$work/one" --steps 12 --threads 2 > /dev/null 2>&1

# 1. Two hosts, six steps.
mpi "${train[*]}" --out "$work/two" --steps 6 --threads 1 > "$work/two.txt" 2>&1 ||
  fail "two ranks on two hosts: $(cat "$work/two.txt")"
grep -q "training with 2 processes" "$work/two.txt" || fail "not two processes: $(cat "$work/two.txt")"
head -7 "$work/one/state_hashes.jsonl" | cmp -s - "$work/two/state_hashes.jsonl" ||
  fail "the two hosts' chain differs from one process's"
for step in "$work"/two/checkpoints/step_000000000 "$work"/two/checkpoints/step_000000005; do
  for file in "$step"/*; do
    cmp -s "$file" "$work/one/checkpoints/$(basename "$step")/$(basename "$file")" ||
      fail "$file differs from one process's"
  done
done
echo "two hosts over TCP: the chain and checkpoints of one process"

# 2. The link cut after the step-5 checkpoint: each rank stops at its --comm-timeout.
timeout=5
mpi "${train[*]}" --out "$work/cut" --steps 200 --threads 1 --comm-timeout $timeout \
  > "$work/cut.txt" 2>&1 &
launcher=$!
for _ in $(seq 600); do
  [[ -e "$work/cut/checkpoints/step_000000005/COMPLETE" ]] && break
  sleep 0.1
done
[[ -e "$work/cut/checkpoints/step_000000005/COMPLETE" ]] || fail "no step-5 checkpoint: $(cat "$work/cut.txt")"
ip -n "$ns1" link set "v1$tag" down
cut_at=$(date +%s)
# Both ranks' processes end within the timeout (and a little for the watchdog's polling).
for _ in $(seq $(((timeout + 10) * 10))); do
  pgrep -f "^$lockstep .*$work/cut" > /dev/null || break
  sleep 0.1
done
stopped=$(($(date +%s) - cut_at))
pgrep -f "^$lockstep .*$work/cut" > /dev/null && fail "a rank still runs $stopped s after the cut"
grep -q "rank 0 of 2 ($ns0): waited [0-9]* s for rank 1 ($ns1)" "$work/cut.txt" ||
  fail "rank 0 did not name rank 1 and its host: $(cat "$work/cut.txt")"
# mpirun waits for the cut-off daemon; with the link back it ends too.
ip -n "$ns1" link set "v1$tag" up
for _ in $(seq 300); do kill -0 $launcher 2> /dev/null || break; sleep 0.1; done
kill -9 $launcher 2> /dev/null || true
wait $launcher 2> /dev/null || true
echo "link cut: both ranks stopped within $stopped s (--comm-timeout $timeout)"

# ... and the run resumes on the two hosts to the chain of one process.
mpi "${train[*]}" --out "$work/cut" --steps 12 --threads 1 --resume > "$work/resume.txt" 2>&1 ||
  fail "the resume: $(cat "$work/resume.txt")"
cmp -s "$work/one/state_hashes.jsonl" "$work/cut/state_hashes.jsonl" ||
  fail "the resumed chain differs from one process's"
echo "resumed after the cut: the chain of one process"
echo "PASS"
