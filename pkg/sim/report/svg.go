package report

import (
	"fmt"
	"html"
	"math"
	"strings"

	"github.com/muster-sched/muster/pkg/sim/measure"
)

// colors per scheduler (ColorBrewer Dark2), then a fallback cycle.
var colors = map[string]string{"muster": "#1b9e77", "default": "#d95f02", "native-gang": "#7570b3"}
var fallback = []string{"#e7298a", "#66a61e", "#e6ab02"}

// SVG plots, per scheduler, the share of the cluster's GPUs allocated to
// running gangs (solid) and held by any bound pod (dashed) against virtual
// time. Each step's value holds until the next step.
func SVG(rep Report, runs []*measure.Run) string {
	const (
		width, height         = 900, 420
		left, right, top, bot = 70, 190, 40, 50
		plotW, plotH          = width - left - right, height - top - bot
	)
	// The time axis ends when the slowest scheduler that finished every job
	// did; a run that deadlocked is carried to the scenario's horizon, which
	// would squeeze the others into a sliver, so its line is cut there.
	end, last := 0.0, 0.0
	for _, r := range runs {
		if n := len(r.Series); n > 0 {
			last = math.Max(last, r.Series[n-1].T)
		}
		if r.Metrics.GangsCompleted == r.Metrics.GangsTotal {
			end = math.Max(end, r.Metrics.MakespanS)
		}
	}
	if end == 0 {
		end = last
	}
	if end == 0 {
		end = 1
	}
	unit, div := "s", 1.0
	switch {
	case end > 3*3600:
		unit, div = "h", 3600
	case end > 300:
		unit, div = "min", 60
	}
	x := func(t float64) float64 { return left + math.Min(t, end)/end*plotW }
	y := func(v float64) float64 { return top + (1-v)*plotH }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15">GPU allocation over virtual time: %s, seed %d (%d GPUs)</text>`+"\n", left, html.EscapeString(rep.Scenario), rep.Seed, rep.GPUs)
	for i := 0; i <= 4; i++ {
		v := float64(i) / 4
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, left+plotW, y(v), y(v))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%d%%</text>`+"\n", left-6, y(v)+4, i*25)
	}
	step := niceStep(end / div / 6)
	for t := 0.0; t <= end/div+1e-9; t += step {
		px := x(t * div)
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#eee"/>`+"\n", px, px, top, top+plotH)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", px, top+plotH+16, trimFloat(t))
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">virtual time (%s)</text>`+"\n", left+plotW/2, height-12, unit)
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#888"/>`+"\n", left, top, plotW, plotH)

	for i, r := range runs {
		color, ok := colors[r.Metrics.Scheduler]
		if !ok {
			color = fallback[i%len(fallback)]
		}
		running, held := polyline(r.Series, end, x, y, func(s measure.Sample) int64 { return s.RunningGPUs }),
			polyline(r.Series, end, x, y, func(s measure.Sample) int64 { return s.HeldGPUs })
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.2" stroke-dasharray="4 3" opacity="0.7" points="%s"/>`+"\n", color, held)
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", color, running)
		ly := top + 14 + i*36
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2"/>`+"\n", left+plotW+12, left+plotW+36, ly, ly, color)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", left+plotW+42, ly+4, html.EscapeString(r.Metrics.Scheduler))
		note := fmt.Sprintf("running %.0f%%, held %.0f%%", 100*r.Metrics.GPUAllocationRatio, 100*r.Details.HeldGPURatio)
		if unfinished := r.Metrics.GangsTotal - r.Metrics.GangsCompleted; unfinished > 0 {
			note = fmt.Sprintf("%d of %d jobs never ran", unfinished, r.Metrics.GangsTotal)
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#555" font-size="11">%s</text>`+"\n", left+plotW+42, ly+18, html.EscapeString(note))
	}
	ly := top + 14 + len(runs)*36 + 10
	fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#555" font-size="11">solid: GPUs of running gangs</text>`+"\n", left+plotW+12, ly)
	fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#555" font-size="11">dashed: GPUs of any bound pod</text>`+"\n", left+plotW+12, ly+15)
	b.WriteString("</svg>\n")
	return b.String()
}

// polyline draws a step function: each sample's share holds until the next
// sample (the last one until end).
func polyline(series []measure.Sample, end float64, x, y func(float64) float64, value func(measure.Sample) int64) string {
	var pts []string
	prev := 0.0
	pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(0), y(0)))
	for _, s := range series {
		share := 0.0
		if s.CapacityGPUs > 0 {
			share = float64(value(s)) / float64(s.CapacityGPUs)
		}
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(s.T), y(prev)), fmt.Sprintf("%.1f,%.1f", x(s.T), y(share)))
		prev = share
	}
	pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(end), y(prev)))
	return strings.Join(pts, " ")
}

func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*mag {
			return m * mag
		}
	}
	return 10 * mag
}

func trimFloat(v float64) string {
	s := fmt.Sprintf("%.2f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s
}
