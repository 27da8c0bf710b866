// Package tools builds the third-party tools that the end-to-end tests run
// beside muster (Kubeflow's training-operator, Kueue) from their released
// source at a pinned version, each as its own module, into a cache directory
// that later runs reuse. The tools never become dependencies of muster's
// go.mod: the go command fetches them from the module proxy like any module.
package tools

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// Tool is a command of a Go module at a pinned version.
type Tool struct {
	// Name names the cache directory: <cache>/<Name>-<Version>.
	Name string
	// Module is the module path, Version the released version to build.
	Module, Version string
	// Command is the main package's directory inside the module.
	Command string
	// GoToolchain, when set, is the GOTOOLCHAIN of this tool's build alone
	// (for a tool whose go.mod needs a newer Go than the machine's).
	// Otherwise the build uses the local toolchain and never downloads one.
	GoToolchain string
}

// The tools the end-to-end tests run, at the versions they prove.
var (
	TrainingOperator = Tool{
		Name:    "training-operator",
		Module:  "github.com/kubeflow/training-operator",
		Version: "v1.8.1",
		Command: "cmd/training-operator.v1",
	}
	Kueue = Tool{
		Name:    "kueue",
		Module:  "sigs.k8s.io/kueue",
		Version: "v0.17.0",
		Command: "cmd/kueue",
	}
)

// CacheEnv overrides the cache root (default: muster-e2e in the user cache
// directory, or in the temp directory where there is none).
const CacheEnv = "MUSTER_E2E_CACHE"

// Build records how a cached binary was made.
type Build struct {
	Module    string        `json:"module"`
	Version   string        `json:"version"`
	Method    string        `json:"method"` // "go install" or "go build in a copy of the module"
	GoVersion string        `json:"goVersion"`
	Duration  time.Duration `json:"duration"`
	Built     time.Time     `json:"built"`
	// Cached is true when this run reused an earlier build.
	Cached bool `json:"-"`
}

func (b Build) String() string {
	if b.Cached {
		return fmt.Sprintf("%s@%s reused (built %s with %s in %s)", b.Module, b.Version,
			b.Built.Format(time.RFC3339), b.Method, b.Duration.Round(time.Second))
	}
	return fmt.Sprintf("%s@%s built with %s in %s (%s)", b.Module, b.Version, b.Method, b.Duration.Round(time.Second), b.GoVersion)
}

// Dir is the tool's cache directory.
func (t Tool) Dir() string {
	root := os.Getenv(CacheEnv)
	if root == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			base = os.TempDir() // no HOME: builds are still reused until reboot
		}
		root = filepath.Join(base, "muster-e2e")
	}
	return filepath.Join(root, t.Name+"-"+t.Version)
}

// Binary returns the path of the tool's binary, building it first unless an
// earlier build is cached. Concurrent callers (two test processes) build it
// once: the cache directory is locked while building.
func (t Tool) Binary() (string, Build, error) {
	dir := t.Dir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", Build{}, err
	}
	unlock, err := lockDir(dir)
	if err != nil {
		return "", Build{}, fmt.Errorf("locking %s: %w", dir, err)
	}
	defer unlock()

	bin := filepath.Join(dir, "bin", path.Base(t.Command))
	stamp := filepath.Join(dir, "build.json")
	if b, err := readStamp(stamp); err == nil && b.Module == t.Module && b.Version == t.Version {
		if _, err := os.Stat(bin); err == nil {
			b.Cached = true
			return bin, b, nil
		}
	}

	b := Build{Module: t.Module, Version: t.Version, GoVersion: goVersion(t.env(dir)), Built: time.Now()}
	start := time.Now()
	out, installErr := t.goInstall(dir)
	b.Method = "go install"
	if installErr != nil {
		if !refusesInstall(out) {
			return "", b, fmt.Errorf("go install %s/%s@%s: %w\n%s", t.Module, t.Command, t.Version, installErr, tail(out, 4000))
		}
		// go install builds a module as its own main module only when its
		// go.mod has no replace or exclude directives; otherwise build it
		// in a copy of its source, where they apply.
		b.Method = "go build in a copy of the module"
		if out, err := t.buildInCopy(dir, bin); err != nil {
			return "", b, fmt.Errorf("go install refused (%s); go build in a copy of %s@%s: %w\n%s",
				firstLine(out), t.Module, t.Version, err, tail(out, 4000))
		}
	}
	b.Duration = time.Since(start)
	if _, err := os.Stat(bin); err != nil {
		return "", b, fmt.Errorf("build of %s@%s left no binary: %w", t.Module, t.Version, err)
	}
	data, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return "", b, err
	}
	return bin, b, os.WriteFile(stamp, data, 0o644)
}

// ModuleDir downloads the module (through the module proxy, or the local
// module cache) and returns the directory of its source: the tools' CRDs
// are read from there.
func ModuleDir(module, version string) (string, error) {
	dir, err := os.MkdirTemp("", "muster-e2e-mod-")
	if err != nil {
		return "", err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	cmd := exec.Command("go", "mod", "download", "-json", module+"@"+version)
	cmd.Dir = dir // outside muster's module, whose go.mod it must not touch
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go mod download %s@%s: %w\n%s%s", module, version, err, stdout.String(), stderr.String())
	}
	var info struct{ Dir, Error string }
	if err := json.Unmarshal(stdout.Bytes(), &info); err != nil {
		return "", fmt.Errorf("go mod download %s@%s: %w", module, version, err)
	}
	if info.Error != "" || info.Dir == "" {
		return "", fmt.Errorf("go mod download %s@%s: %s", module, version, info.Error)
	}
	return info.Dir, nil
}

// SourceDir is ModuleDir of the tool.
func (t Tool) SourceDir() (string, error) { return ModuleDir(t.Module, t.Version) }

// env is the build environment: the caller's, without muster's module
// settings, the tool's toolchain, binaries into dir/bin.
func (t Tool) env(dir string) []string {
	toolchain := "local"
	if t.GoToolchain != "" {
		toolchain = t.GoToolchain
	}
	return append(os.Environ(),
		"GOFLAGS=", "GOWORK=off", "GOTOOLCHAIN="+toolchain,
		"GOBIN="+filepath.Join(dir, "bin"))
}

func (t Tool) goInstall(dir string) ([]byte, error) {
	cmd := exec.Command("go", "install", t.Module+"/"+t.Command+"@"+t.Version)
	cmd.Dir = dir
	cmd.Env = t.env(dir)
	return cmd.CombinedOutput()
}

func (t Tool) buildInCopy(dir, bin string) ([]byte, error) {
	src, err := t.SourceDir()
	if err != nil {
		return nil, err
	}
	copyDir := filepath.Join(dir, "src")
	if err := os.RemoveAll(copyDir); err != nil {
		return nil, err
	}
	if err := copyTree(src, copyDir); err != nil {
		return nil, fmt.Errorf("copying %s: %w", src, err)
	}
	cmd := exec.Command("go", "build", "-buildvcs=false", "-o", bin, "./"+t.Command)
	cmd.Dir = copyDir
	cmd.Env = t.env(dir)
	return cmd.CombinedOutput()
}

// refusesInstall tells a go install that cannot build the module as its own
// main module (it would not apply the module's directives) from a failed
// build.
func refusesInstall(out []byte) bool {
	s := string(out)
	return strings.Contains(s, "contains one or more replace directives") ||
		strings.Contains(s, "contains one or more exclude directives")
}

func goVersion(env []string) string {
	cmd := exec.Command("go", "env", "GOVERSION")
	cmd.Env = env
	out, err := cmd.Output()
	if err != nil {
		return "unknown Go"
	}
	return strings.TrimSpace(string(out))
}

func readStamp(path string) (Build, error) {
	var b Build
	data, err := os.ReadFile(path)
	if err != nil {
		return b, err
	}
	return b, json.Unmarshal(data, &b)
}

// copyTree copies a module's source (read-only in the module cache) into a
// writable tree.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		return copyFile(p, target)
	})
}

func copyFile(src, dst string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, out.Close()) }()
	_, err = io.Copy(out, in)
	return err
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return s
}

func tail(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return "…" + string(b[len(b)-n:])
}
