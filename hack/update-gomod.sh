#!/usr/bin/env bash
# Pins k8s.io/kubernetes and replaces every staging module it requires at v0.0.0
# with the matching published v0.<minor>.<patch>, so a Kubernetes upgrade is one command:
#   hack/update-gomod.sh v1.37.2
set -o errexit -o nounset -o pipefail

version=${1:-$(cat "$(dirname "$0")/../.k8s-version")}
staging_version="v0${version#v1}"
cd "$(dirname "$0")/.."

go mod download "k8s.io/kubernetes@${version}"
k8s_gomod=$(go mod download -json "k8s.io/kubernetes@${version}" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')

# Staging modules are the k8s.io requirements pinned at v0.0.0.
staging=$(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' "$k8s_gomod" | sort -u)

edits=(-require="k8s.io/kubernetes@${version}")
for m in $staging; do
  edits+=(-replace="${m}=${m}@${staging_version}")
done
go mod edit "${edits[@]}"
echo "$version" > .k8s-version
go mod tidy
echo "pinned k8s.io/kubernetes ${version}; $(echo "$staging" | wc -l) staging modules at ${staging_version}"
