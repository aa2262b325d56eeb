#!/usr/bin/env bash
# Runs every test binary `cargo test --all-targets` runs, several at once. The integration
# tests mostly wait (for the control plane, the node, Git, a lease), so on 2 cores three
# binaries at a time take about half as long as cargo's one after another. Each test already
# works in namespaces of its own; what cannot share the cluster is kept apart:
# - alone, after all the others: the binaries that stop the API server or freeze etcd
#   (every other test's cluster would stop with it), the fleet tests (each starts two more
#   control planes), and the sharding test (a replica's Leases must be released within 3 s of
#   its SIGTERM, which three binaries' load beside the fleet test's control planes exceeded);
# - one at a time, beside the others: the binaries that install linnet itself into
#   linnet-system with its cluster-wide objects.
# Longest first (from the last run's times in target/test-times, else the list below).
#
# Usage: tests/run.sh [ARGS for every test binary, as after `cargo test --`]
#   LINNET_TEST_JOBS   binaries at a time (default 3; 1 is cargo's order, one by one)
# Each binary's output goes to target/test-logs/NAME.log and is printed when it ends; all of
# it is also in target/test.log. Exits 1 if any binary failed, after running all of them.
set -uo pipefail
cd "$(dirname "$0")/.."
jobs=${LINNET_TEST_JOBS:-3}
alone=" apiserver_restart fencing fleet fleet_git fleet_soak sharding "
one_at_a_time=" deploy doctor node_install node_namespace_install "
# Before any time is on record: the longest first, as measured three at a time.
first="node_namespace_install soak chaos statefulset node_data node_install bench traffic gitea
  deploy agent analysis status_truth monitoring deployment hostile node_kubelet"

logs=target/test-logs
mkdir -p "$logs"
: >target/test.log

# kind name dir executable, one line per test binary, built if needed.
list=$(${CARGO:-cargo} test --all-targets --no-run --message-format=json-render-diagnostics |
  jq -r 'select(.reason == "compiler-artifact" and .executable != null and .profile.test)
    | "\(.target.kind[0]) \(.target.name) \(.manifest_path | sub("/Cargo.toml$"; "")) \(.executable)"') ||
  { echo "run.sh: the tests did not build" >&2; exit 101; }

declare -A exe dir kind
names=()
while read -r k n d e; do
  # A bin, lib and example may share a name: the log name says which.
  id=$n; [ "$k" = test ] || id="$k-$n"
  exe[$id]=$e dir[$id]=$d kind[$id]=$k
  names+=("$id")
done <<<"$list"

declare -A took
if [ -f target/test-times ]; then
  while read -r s n; do took[$n]=$s; done <target/test-times
else
  s=1000
  for n in $first; do took[$n]=$s; s=$((s - 1)); done
fi
order=$(for n in "${names[@]}"; do echo "${took[$n]:-0} $n"; done | sort -rn | awk '{print $2}')

declare -A pid_of started
failed=()
passed_total=0 failed_total=0
: >target/test-times.new

start() {
  local n=$1
  started[$n]=$SECONDS
  (cd "${dir[$n]}" && exec "${exe[$n]}" "${@:2}") >"$logs/$n.log" 2>&1 &
  pid_of[$!]=$n
}

finish() {
  local n=$1 rc=$2 secs=$((SECONDS - ${started[$n]})) p f
  p=$(awk '/^test result:/ { s += $4 } END { print s + 0 }' "$logs/$n.log")
  f=$(awk '/^test result:/ { s += $6 } END { print s + 0 }' "$logs/$n.log")
  passed_total=$((passed_total + p)) failed_total=$((failed_total + f))
  echo "$secs $n" >>target/test-times.new
  local verdict=ok
  if [ "$rc" != 0 ]; then verdict="FAILED (exit $rc)"; failed+=("$n"); fi
  echo "──── ${kind[$n]} $n: $verdict, $p passed, $f failed, ${secs}s ────"
  cat "$logs/$n.log"
  cat "$logs/$n.log" >>target/test.log
}

# The pool: up to $jobs at once, the one-at-a-time ones never two together.
pending=()
for n in $order; do [[ $alone == *" $n "* ]] || pending+=("$n"); done
running=0 installing=""
while [ ${#pending[@]} -gt 0 ] || [ "$running" -gt 0 ]; do
  while [ "$running" -lt "$jobs" ]; do
    # The one-at-a-time ones are a chain: start the next of them as soon as it may start.
    pick=-1
    if [ -z "$installing" ]; then
      for i in "${!pending[@]}"; do
        [[ $one_at_a_time == *" ${pending[$i]} "* ]] && { pick=$i; break; }
      done
    fi
    if [ "$pick" -lt 0 ]; then
      for i in "${!pending[@]}"; do
        [[ $one_at_a_time == *" ${pending[$i]} "* ]] || { pick=$i; break; }
      done
    fi
    [ "$pick" -ge 0 ] || break
    n=${pending[$pick]}
    unset 'pending[pick]'; pending=("${pending[@]}")
    [[ $one_at_a_time == *" $n "* ]] && installing=$n
    start "$n" "$@"
    running=$((running + 1))
  done
  wait -n -p done_pid
  rc=$?
  n=${pid_of[$done_pid]}
  unset 'pid_of[$done_pid]'
  running=$((running - 1))
  [ "$installing" = "$n" ] && installing=""
  finish "$n" "$rc"
done

for n in $order; do
  [[ $alone == *" $n "* ]] || continue
  start "$n" "$@"
  wait "$!"
  rc=$?
  unset 'pid_of[$!]'
  finish "$n" "$rc"
done

# A filtered run's times say nothing about the next whole one.
if [ $# -eq 0 ]; then mv target/test-times.new target/test-times; else rm -f target/test-times.new; fi
echo "tests: $passed_total passed, $failed_total failed, in ${#names[@]} binaries, ${SECONDS}s ($jobs at a time)"
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed: ${failed[*]} (their output: target/test-logs/NAME.log)"
  exit 1
fi
