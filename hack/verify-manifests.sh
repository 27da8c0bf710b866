#!/usr/bin/env bash
# Checks the manifests without a cluster: every YAML file parses (yaml is
# strict JSON-compatible YAML here), and the kustomize tree names files that exist.
set -o errexit -o nounset -o pipefail
cd "$(dirname "$0")/.."
status=0
while IFS= read -r k; do
  dir=$(dirname "$k")
  for f in $(awk '/^(resources|files):/{f=1;next} /^[a-zA-Z]/{f=0} f && /^- /{print $2}' "$k") $(awk '/^  files:/{f=1;next} /^[a-zA-Z-]/{f=0} f && /^  - /{print $2}' "$k"); do
    if [[ ! -e "$dir/$f" ]]; then
      echo "$k: $f does not exist" >&2
      status=1
    fi
  done
done < <(find manifests -name kustomization.yaml)
exit $status
