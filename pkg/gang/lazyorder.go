package gang

// lazyOrder yields elements in less-order, sorting only as far as it is
// read: placing a gang usually reads the first few nodes of a domain that
// has thousands. Elements already read may have their key lowered (moveUp);
// the unread ones sit in a heap.
type lazyOrder[T any] struct {
	done []T // the smallest elements, in order
	rest []T // a binary min-heap of the others
	less func(a, b *T) bool
}

func newLazyOrder[T any](items []T, less func(a, b *T) bool) *lazyOrder[T] {
	o := &lazyOrder[T]{done: make([]T, 0, len(items)), rest: items, less: less}
	for i := len(o.rest)/2 - 1; i >= 0; i-- {
		o.down(i)
	}
	return o
}

// at returns the i-th smallest element, or nil when there are no more.
// The pointer is valid until the next call of at.
func (o *lazyOrder[T]) at(i int) *T {
	for len(o.done) <= i && len(o.rest) > 0 {
		last := len(o.rest) - 1
		o.rest[0], o.rest[last] = o.rest[last], o.rest[0]
		o.done = append(o.done, o.rest[last])
		o.rest = o.rest[:last]
		o.down(0)
	}
	if i < len(o.done) {
		return &o.done[i]
	}
	return nil
}

// moveUp restores the order after the key of the i-th element was lowered.
// A lowered key stays below every unread element, so it only moves within
// the read part.
func (o *lazyOrder[T]) moveUp(i int) {
	for j := i; j > 0 && o.less(&o.done[j], &o.done[j-1]); j-- {
		o.done[j], o.done[j-1] = o.done[j-1], o.done[j]
	}
}

func (o *lazyOrder[T]) down(i int) {
	n := len(o.rest)
	for {
		smallest, l, r := i, 2*i+1, 2*i+2
		if l < n && o.less(&o.rest[l], &o.rest[smallest]) {
			smallest = l
		}
		if r < n && o.less(&o.rest[r], &o.rest[smallest]) {
			smallest = r
		}
		if smallest == i {
			return
		}
		o.rest[i], o.rest[smallest] = o.rest[smallest], o.rest[i]
		i = smallest
	}
}
