#!/usr/bin/env bash
# Fails when the generated code under pkg/apis is not what hack/update-codegen.sh writes.
set -o errexit -o nounset -o pipefail
cd "$(dirname "$0")/.."

hack/update-codegen.sh
if ! git diff --quiet -- pkg/apis || [ -n "$(git ls-files --others --exclude-standard -- pkg/apis)" ]; then
  git status --short -- pkg/apis
  git diff -- pkg/apis | head -50
  echo "generated code is stale: run hack/update-codegen.sh and commit the result" >&2
  exit 1
fi
