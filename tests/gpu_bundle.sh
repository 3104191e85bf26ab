#!/usr/bin/env bash
# Builds every program and test binary that tests/gpu_acceptance.sh runs,
# so that a GPU machine without Go (or without network access for the
# modules) can run the acceptance from them. Needs Go and gcc (cgo), not
# CUDA. Usage, from the repository root:
#
#	tests/gpu_bundle.sh [-d DIR] [BUNDLE]
#
# With -d the binaries go into DIR; otherwise into BUNDLE, a tar.xz
# (default .gpu/bundle.tar.xz; .gitignore keeps .gpu out of git). The
# bundle's binaries are linux/amd64 with cgo, stripped, built with -trimpath; each
# embeds the kernels' PTX (2.4 MB), which xz -9 stores once. On the GPU
# machine, from the repository root:
#
#	tests/gpu_acceptance.sh -b .gpu/bundle.tar.xz OUTDIR
set -euo pipefail
cd "$(dirname "$0")/.."

dir= bundle=.gpu/bundle.tar.xz
while getopts d: opt; do
	case $opt in
	d) dir=$OPTARG ;;
	*) echo "usage: $0 [-d DIR] [BUNDLE]" >&2; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] && bundle=$1

out=$dir
if [ -z "$out" ]; then
	out=$(mktemp -d)
	trap 'rm -rf "$out"' EXIT
fi
mkdir -p "$out"
export CGO_ENABLED=1 GOOS=linux GOARCH=amd64
flags=()
if [ -z "$dir" ]; then
	# For the tarball: smaller, and no paths of this machine. (-d builds
	# as go test does, so that Go's build cache serves it.)
	flags=(-trimpath -ldflags=-s\ -w)
fi
# Test binaries, named after their packages; gpu_acceptance.sh runs each
# in its package's directory.
for pkg in gpu/internal/engine gpu internal/cufile p2p; do
	go test -c "${flags[@]}" -o "$out/$(basename "$pkg").test" "./$pkg"
done
go build "${flags[@]}" -o "$out/" ./cmd/gccl-run ./cmd/gccl-perf ./cmd/gccl-p2pbench ./tests/devcheck
git rev-parse HEAD >"$out/COMMIT" 2>/dev/null || echo unknown >"$out/COMMIT"
if ! git diff --quiet HEAD 2>/dev/null; then
	echo "(with uncommitted changes)" >>"$out/COMMIT"
fi

if [ -z "$dir" ]; then
	mkdir -p "$(dirname "$bundle")"
	# One xz stream with a 64 MiB dictionary: the PTX every binary embeds
	# is stored once.
	tar -C "$out" -cf - . | xz -9 -T1 >"$bundle.tmp"
	mv "$bundle.tmp" "$bundle"
	echo "$bundle: $(du -h "$bundle" | cut -f1), commit $(head -c 12 "$out/COMMIT")"
fi
