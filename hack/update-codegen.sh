#!/usr/bin/env bash
# Regenerates deepcopy, conversion and defaulting code for muster's API types
# with k8s.io/code-generator at the version of the Kubernetes staging modules.
# The generators read the +k8s: tags in each package's doc.go and types.go.
# hack/verify-codegen.sh (make verify) fails when the output is stale.
set -o errexit -o nounset -o pipefail
cd "$(dirname "$0")/.."

CODEGEN_VERSION=$(go list -m -f '{{.Version}}' k8s.io/apimachinery)
MODULE=github.com/muster-sched/muster
gen() { go run "k8s.io/code-generator/cmd/$1@${CODEGEN_VERSION}" --go-header-file hack/boilerplate.go.txt "${@:2}"; }

gen deepcopy-gen --output-file zz_generated.deepcopy.go \
  "$MODULE/pkg/apis/config" "$MODULE/pkg/apis/config/v1" "$MODULE/pkg/apis/scheduling/v1alpha1"
gen defaulter-gen --output-file zz_generated.defaults.go "$MODULE/pkg/apis/config/v1"
gen conversion-gen --output-file zz_generated.conversion.go \
  --extra-peer-dirs k8s.io/apimachinery/pkg/apis/meta/v1,k8s.io/apimachinery/pkg/conversion,k8s.io/apimachinery/pkg/runtime \
  "$MODULE/pkg/apis/config/v1"
