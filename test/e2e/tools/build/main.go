// Command build builds the end-to-end tests' tools at their pinned versions
// into the cache (or finds them there) and says how long each build took.
// `make e2e` runs it before the tests, which then reuse the builds.
package main

import (
	"fmt"
	"os"

	"github.com/muster-sched/muster/test/e2e/tools"
)

func main() {
	failed := false
	for _, tool := range []tools.Tool{tools.TrainingOperator, tools.Kueue} {
		binary, build, err := tool.Binary()
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", tool.Name, err)
			failed = true
			continue
		}
		fmt.Printf("%s: %s\n  %s\n", tool.Name, build, binary)
	}
	if failed {
		os.Exit(1)
	}
}
