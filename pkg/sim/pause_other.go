//go:build !linux

package sim

import "time"

// pauser makes the driver's short waits (pause_linux.go says why Linux
// uses a timerfd; elsewhere they may come out longer than asked).
type pauser struct{}

func newPauser() *pauser { return &pauser{} }

func (*pauser) pause(d time.Duration) { time.Sleep(d) }

func (*pauser) close() {}
