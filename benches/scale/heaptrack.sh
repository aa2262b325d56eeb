#!/bin/bash
# Runs the scale bench's agent under heaptrack, for a heap profile of what is live at a phase's
# end (docs/performance.md, "Where the memory goes"). Give it as the agent wrapper, with the
# words the bench's `pkill` looks for, and a glibc build (heaptrack hooks malloc) under a name
# other than `linnet`, which the bench's `pkill` would stop gracefully:
#
#   cargo build --release --bin linnet --features system-allocator
#   cp target/release/linnet /tmp/linnet-glibc
#   LINNET_BENCH_LINNET_BIN=/tmp/linnet-glibc \
#   LINNET_BENCH_AGENT_WRAPPER="benches/scale/heaptrack.sh {n} linnet agent 127.0.0.1:{port} --" \
#   LINNET_BENCH_SIZES=1000 ... cargo bench --bench scale
#
# Agent start N writes $LINNET_HEAP_DIR/agent-N.zst (default /tmp/linnet-heap). When the bench
# stops the agent (SIGTERM), the agent is killed with SIGKILL instead, so that nothing is freed
# on the way out and heaptrack's "leaked" is exactly what was live:
#
#   heaptrack_print -f agent-1.zst --flamegraph-cost-type leaked -F live.folded
set -u
n=$1
port=${4#127.0.0.1:}
shift 5
dir=${LINNET_HEAP_DIR:-/tmp/linnet-heap}
mkdir -p "$dir"
heaptrack -o "$dir/agent-$n" "$@" >"$dir/heaptrack-$n.log" 2>&1 &
profiled=$!
agent=$(basename "$1")
# Only heaptrack's child that is the agent (not heaptrack's interpreter, not this script).
trap 'pkill -KILL -P "$profiled" -f "$agent agent .*127.0.0.1:$port"' TERM
while kill -0 "$profiled" 2>/dev/null; do wait "$profiled"; done
