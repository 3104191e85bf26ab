#!/usr/bin/env bash
# Runs every Go fuzz target of the module (func FuzzXxx in a _test.go file)
# for a few seconds each: the parsers and wire decoders that read what a
# peer, a file or the environment says. A crash is written to the package's
# testdata/fuzz/FuzzXxx directory, as go test does, and fails the script.
#
#	tests/fuzz.sh [seconds per target]    (default 3)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-3}
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}"
start=$(date +%s)
n=0
failed=()
# Package directory and target name of every fuzz target, in file order.
while read -r dir name; do
	n=$((n + 1))
	echo "=== fuzz ./$dir $name (${secs}s)"
	if ! go test -run='^$' -fuzz="^${name}\$" -fuzztime="${secs}s" "./$dir" >/tmp/gccl-fuzz.$$.log 2>&1; then
		cat /tmp/gccl-fuzz.$$.log
		failed+=("./$dir $name")
	fi
done < <(git ls-files '*_test.go' | xargs grep -H '^func Fuzz[A-Za-z0-9_]*(f \*testing.F)' |
	sed -E 's|^(.*)/[^/]*:func (Fuzz[A-Za-z0-9_]*)\(.*|\1 \2|' | grep -v '^examples/')
rm -f /tmp/gccl-fuzz.$$.log
echo "fuzz: $n targets, ${secs}s each, $(($(date +%s) - start)) s in all"
if [ ${#failed[@]} -gt 0 ]; then
	printf 'fuzz: FAILED %s\n' "${failed[@]}"
	exit 1
fi
