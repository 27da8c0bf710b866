//go:build !unix

package tools

// lockDir does not lock where flock is missing: run one test process at a
// time there.
func lockDir(string) (func(), error) { return func() {}, nil }
