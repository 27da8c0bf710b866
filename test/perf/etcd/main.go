//go:build perf

// Command etcd is the etcd server of the go.etcd.io/etcd/server/v3 version in
// go.mod, for scheduler_perf (framework.StartEtcd runs an `etcd` binary found
// on PATH). hack/build-etcd.sh builds it into a cache directory; the build
// tag keeps it out of go vet, make verify and make test.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
