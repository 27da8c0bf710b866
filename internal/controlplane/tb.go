package controlplane

import (
	"fmt"
	"io"
	"os"
	"sync"

	"k8s.io/kubernetes/test/utils/ktesting"
)

// ProcessTB lets a program that is not a test (the demo) start a control
// plane: the API server's test helper wants a testing.TB. Logs go to Output
// (io.Discard when nil); failures end the process after running cleanups.
type ProcessTB struct {
	Output io.Writer

	mu       sync.Mutex
	cleanups []func()
	failed   bool
	dirs     []string
}

var _ ktesting.TB = &ProcessTB{}

func (p *ProcessTB) out() io.Writer {
	if p.Output == nil {
		return io.Discard
	}
	return p.Output
}

// Close runs the cleanups in reverse order and removes temporary directories.
func (p *ProcessTB) Close() {
	p.mu.Lock()
	cleanups := p.cleanups
	p.cleanups = nil
	p.mu.Unlock()
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
	for _, d := range p.dirs {
		_ = os.RemoveAll(d)
	}
}

func (p *ProcessTB) Attr(key, value string) {}
func (p *ProcessTB) Chdir(dir string) {
	if err := os.Chdir(dir); err != nil {
		p.Fatal(err)
	}
}
func (p *ProcessTB) Cleanup(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cleanups = append(p.cleanups, f)
}
func (p *ProcessTB) Error(args ...any) { p.Log(args...); p.Fail() }
func (p *ProcessTB) Errorf(format string, args ...any) {
	p.Logf(format, args...)
	p.Fail()
}
func (p *ProcessTB) Fail() { p.mu.Lock(); p.failed = true; p.mu.Unlock() }
func (p *ProcessTB) FailNow() {
	p.Close()
	os.Exit(1)
}
func (p *ProcessTB) Failed() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.failed }
func (p *ProcessTB) Fatal(args ...any) {
	fmt.Fprintln(os.Stderr, args...)
	p.FailNow()
}
func (p *ProcessTB) Fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	p.FailNow()
}
func (p *ProcessTB) Helper()                          {}
func (p *ProcessTB) Log(args ...any)                  { fmt.Fprintln(p.out(), args...) }
func (p *ProcessTB) Logf(format string, args ...any)  { fmt.Fprintf(p.out(), format+"\n", args...) }
func (p *ProcessTB) Name() string                     { return "muster-demo" }
func (p *ProcessTB) Setenv(key, value string)         { _ = os.Setenv(key, value) }
func (p *ProcessTB) Skip(args ...any)                 { p.Log(args...) }
func (p *ProcessTB) Skipf(format string, args ...any) { p.Logf(format, args...) }
func (p *ProcessTB) SkipNow()                         {}
func (p *ProcessTB) Skipped() bool                    { return false }
func (p *ProcessTB) TempDir() string {
	d, err := os.MkdirTemp("", "muster-demo-")
	if err != nil {
		p.Fatal(err)
	}
	p.mu.Lock()
	p.dirs = append(p.dirs, d)
	p.mu.Unlock()
	return d
}
