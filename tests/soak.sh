#!/usr/bin/env bash
# The long fault soak: tests/soak_test.go's TestFaultSoak for many rounds.
# Each round starts a 4-rank all-reduce job (shared memory, then TCP) or two
# p2p agents (shared memory, then TCP), SIGKILLs or SIGSTOPs a random one at
# a random moment, and checks the survivors' errors, detection time, exit
# and leftovers. The log prints the seed and a replay command for a failing
# round, and per kind and fault the worst detection time.
#
#	tests/soak.sh [rounds] [seed]     (default: 200 rounds, seed from the clock)
set -euo pipefail
cd "$(dirname "$0")"
rounds=${1:-200}
seed=${2:-$(date +%s%N)}
# ~5 s a round at worst (a stop is noticed after the 3 s heartbeat timeout).
limit=$((rounds * 20 + 120))
log=$(mktemp /tmp/gccl-soak-XXXXXX.log)
echo "soak: $rounds rounds, GCCL_SOAK_SEED=$seed, log $log"
start=$(date +%s)
set +e
GCCL_SOAK_ROUNDS=$rounds GCCL_SOAK_SEED=$seed go test -count=1 -v -run '^TestFaultSoak$' -timeout "${limit}s" . >"$log" 2>&1
rc=$?
set -e
grep -E 'soak summary|replay:|^(--- )?FAIL|^ok' "$log" || true
echo "soak: exit $rc after $(($(date +%s) - start)) s"
exit $rc
