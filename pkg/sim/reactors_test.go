package sim

import (
	"fmt"
	"testing"
)

// The bind log keeps a binding until every reader has read it: a reader
// that lags holds the records it has not read, and once all have read them
// they are dropped, so a month of bindings is never kept whole.
func TestBindLogDropsWhatEveryReaderRead(t *testing.T) {
	var l bindLog
	fast, slow := l.reader(), l.reader()
	bind := func(n int) {
		for i := range n {
			l.add(bindRecord{pod: fmt.Sprintf("pod-%d", i), node: "node"})
		}
	}
	bind(100)
	fast.read(len(fast.unread()))
	if got := l.kept(); got != 100 {
		t.Fatalf("the slow reader has read nothing, yet the log keeps %d of 100 records", got)
	}
	unread := slow.unread()
	if len(unread) != 100 || unread[0].pod != "pod-0" {
		t.Fatalf("the slow reader sees %d records from %v, want 100 from pod-0", len(unread), unread[0])
	}
	slow.read(60)
	if got := l.kept(); got != 40 {
		t.Fatalf("both readers read 60 records, the log keeps %d, want 40", got)
	}
	if got := slow.unread(); len(got) != 40 || got[0].pod != "pod-60" {
		t.Fatalf("after reading 60 the slow reader sees %d records from %v, want 40 from pod-60", len(got), got[0])
	}
	if got := fast.unread(); len(got) != 0 {
		t.Fatalf("the fast reader read everything, yet sees %d records", len(got))
	}
	for range 1000 {
		bind(10)
		fast.read(len(fast.unread()))
		slow.read(len(slow.unread()))
	}
	if got := l.kept(); got != 0 {
		t.Fatalf("after 10,000 bindings read by both readers the log keeps %d records", got)
	}
}
