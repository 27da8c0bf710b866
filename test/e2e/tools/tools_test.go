package tools

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestBinaryReusesACachedBuild(t *testing.T) {
	t.Setenv(CacheEnv, t.TempDir())
	tool := Tool{Name: "fake", Module: "example.com/fake", Version: "v1.0.0", Command: "cmd/fake"}
	dir := tool.Dir()
	want := filepath.Join(dir, "bin", "fake")
	if err := os.MkdirAll(filepath.Dir(want), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(want, []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	stamp, _ := json.Marshal(Build{Module: tool.Module, Version: tool.Version, Method: "go install", Duration: 90 * time.Second})
	if err := os.WriteFile(filepath.Join(dir, "build.json"), stamp, 0o644); err != nil {
		t.Fatal(err)
	}

	// example.com/fake cannot be fetched: only the cache can answer.
	got, build, err := tool.Binary()
	if err != nil {
		t.Fatal(err)
	}
	if got != want || !build.Cached || build.Duration != 90*time.Second {
		t.Errorf("Binary() = %s, %+v; want the cached %s", got, build, want)
	}
}

func TestRefusesInstall(t *testing.T) {
	for out, want := range map[string]bool{
		"go: example.com/x@v1 (in example.com/x@v1):\n\tThe go.mod file for the module providing named packages contains one or more replace directives.": true,
		"go: example.com/x@v1: The go.mod file ... contains one or more exclude directives.":                                                              true,
		"pkg/foo.go:3:2: undefined: bar": false,
	} {
		if got := refusesInstall([]byte(out)); got != want {
			t.Errorf("refusesInstall(%q) = %v, want %v", out, got, want)
		}
	}
}
