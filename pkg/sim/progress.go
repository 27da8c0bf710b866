package sim

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// ProgressState is where a run is.
type ProgressState struct {
	Virtual              time.Duration
	Done, Running, Total int
}

// Progress draws a progress bar on a terminal (redrawn in place) or, when
// the output is a file or pipe, writes a line every 10%. Nothing is shown for
// the first two seconds, so short runs stay quiet. A nil *Progress is valid
// and shows nothing.
type Progress struct {
	w       io.Writer
	label   string
	tty     bool
	start   time.Time
	last    time.Time
	lastPct int
	drawn   bool
}

// progressDelay keeps runs shorter than this silent.
const progressDelay = 2 * time.Second

// NewProgress returns a progress bar labelled label on w.
func NewProgress(w io.Writer, label string, tty bool) *Progress {
	return &Progress{w: w, label: label, tty: tty, start: time.Now(), lastPct: -1}
}

// IsTerminal reports whether f is a character device (a terminal).
func IsTerminal(f *os.File) bool {
	info, err := f.Stat()
	return err == nil && info.Mode()&os.ModeCharDevice != 0
}

// Update redraws the bar if enough time has passed.
func (p *Progress) Update(st ProgressState) {
	if p == nil {
		return
	}
	now := time.Now()
	if now.Sub(p.start) < progressDelay {
		return
	}
	pct := 0
	if st.Total > 0 {
		pct = 100 * st.Done / st.Total
	}
	if p.tty {
		if now.Sub(p.last) < 100*time.Millisecond {
			return
		}
		fmt.Fprintf(p.w, "\r%s", p.line(st, pct, now))
		p.drawn = true
	} else {
		if pct/10 == p.lastPct/10 && now.Sub(p.last) < 30*time.Second {
			return
		}
		fmt.Fprintln(p.w, p.line(st, pct, now))
	}
	p.last, p.lastPct = now, pct
}

// Done finishes the bar (only if it was shown).
func (p *Progress) Done(st ProgressState) {
	if p == nil || time.Since(p.start) < progressDelay {
		return
	}
	pct := 100
	if st.Total > 0 {
		pct = 100 * st.Done / st.Total
	}
	switch {
	case p.tty:
		fmt.Fprintf(p.w, "\r%s\n", p.line(st, pct, time.Now()))
	case pct != p.lastPct:
		fmt.Fprintln(p.w, p.line(st, pct, time.Now()))
	}
}

func (p *Progress) line(st ProgressState, pct int, now time.Time) string {
	const width = 24
	filled := width * pct / 100
	bar := strings.Repeat("#", filled) + strings.Repeat(".", width-filled)
	return fmt.Sprintf("%-12s [%s] %3d%%  %d/%d jobs done, %d running, virtual %s, real %s ",
		p.label, bar, pct, st.Done, st.Total, st.Running, st.Virtual.Round(time.Second), now.Sub(p.start).Round(100*time.Millisecond))
}
