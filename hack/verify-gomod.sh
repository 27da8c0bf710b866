#!/usr/bin/env bash
# Fails when go mod tidy would change go.mod or go.sum.
set -o errexit -o nounset -o pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp go.mod go.sum "$tmp/"
go mod tidy
if ! diff -q go.mod "$tmp/go.mod" >/dev/null || ! diff -q go.sum "$tmp/go.sum" >/dev/null; then
  diff -u "$tmp/go.mod" go.mod || true
  cp "$tmp/go.mod" "$tmp/go.sum" .
  echo "go mod tidy changes go.mod/go.sum: run it and commit the result" >&2
  exit 1
fi
