package sim

import (
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// pauser makes the driver's short waits between two looks at the
// scheduler's state. They are far shorter than a millisecond, and neither
// time.Sleep nor a blocking sleep serves them:
//   - with the rest of the process idle (the scheduler has just finished,
//     or waits for the step), the runtime's timers wake from the network
//     poller's wait, which has millisecond resolution: a sub-millisecond
//     time.Sleep lasts about a millisecond, and the step's busy time
//     counted the rest;
//   - nanosleep is precise but holds the goroutine's P for its length,
//     which the scheduler (2 Ps on 2 cores) then misses.
//
// A timerfd read through the runtime's poller is both precise (BenchmarkPause
// in pause_test.go measures how late) and parks the goroutine without
// holding a P. One goroutine (the
// step loop) uses a pauser: two waiting on one timer would wait forever.
type pauser struct {
	fd int
	f  *os.File // nil when no timerfd could be made: time.Sleep then
}

func newPauser() *pauser {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return &pauser{fd: -1}
	}
	return &pauser{fd: fd, f: os.NewFile(uintptr(fd), "sim-pause-timerfd")}
}

func (p *pauser) pause(d time.Duration) {
	if p.f != nil {
		spec := unix.ItimerSpec{Value: unix.NsecToTimespec(max(d, time.Microsecond).Nanoseconds())}
		if unix.TimerfdSettime(p.fd, 0, &spec, nil) == nil {
			var expirations [8]byte
			if _, err := p.f.Read(expirations[:]); err == nil {
				return
			}
		}
	}
	time.Sleep(d)
}

func (p *pauser) close() {
	if p.f != nil {
		_ = p.f.Close()
		p.f = nil // the fd number may be reused
	}
}
