package sim

import (
	"testing"
	"time"
)

func TestPauseWaitsAtLeastItsDuration(t *testing.T) {
	p := newPauser()
	defer p.close()
	for _, d := range []time.Duration{time.Microsecond, 50 * time.Microsecond, 2 * time.Millisecond} {
		start := time.Now()
		p.pause(d)
		if took := time.Since(start); took < d {
			t.Errorf("pause(%s) returned after %s", d, took)
		}
	}
}

// BenchmarkPause shows how long the harness's poll wait really takes
// (ns/op; pollInterval is 50 µs): time.Sleep's would be about 1.1 ms in an
// otherwise idle process.
func BenchmarkPause(b *testing.B) {
	p := newPauser()
	defer p.close()
	for b.Loop() {
		p.pause(pollInterval)
	}
}
