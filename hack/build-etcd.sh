#!/usr/bin/env bash
# Builds the etcd server of the go.etcd.io/etcd/server/v3 version in go.mod
# (test/perf/etcd) into ${MUSTER_PERF_CACHE:-~/.cache/muster-perf}/etcd-<version>/etcd,
# once: an existing binary is reused. Prints the directory holding it, for PATH.
# Nothing is downloaded but Go modules.
set -o errexit -o nounset -o pipefail
cd "$(dirname "$0")/.."
version=$(go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)
dir=${MUSTER_PERF_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/muster-perf}/etcd-$version
if [[ ! -x $dir/etcd ]]; then
  mkdir -p "$dir"
  echo "building etcd $version into $dir" >&2
  go build -tags perf -trimpath -o "$dir/etcd.tmp" ./test/perf/etcd
  mv "$dir/etcd.tmp" "$dir/etcd"
fi
echo "$dir"
