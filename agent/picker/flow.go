package picker

import (
	"context"
	"slices"
	"time"

	"github.com/servemesh/servemesh/meshspec"
)

// Flow control (meshspec/flow.go says what users write): while every ready
// replica of a backend on the node is saturated and has
// max_concurrent_queries in flight, requests of priority 0 or more wait
// here, in bands by priority, each band a ring of tenants with a
// queue of their own. A replica that frees takes the first request of the
// next tenant in turn in the highest band (dispatch), so a tenant sending
// ten times another's rate gets no more turns than it; but a request that
// states a deadline (wire.TTFTObjectiveHeader) goes before those that do
// not, the earliest first, and with load_aware.refuse_late one that can no
// longer meet it is refused. Requests of
// priority below 0 never wait (shed), and a full queue refuses the lowest
// priority first.

// waiter is a request waiting for a replica.
type waiter struct {
	req     request
	backend string
	// picked receives the replica once dispatched (buffered: dispatch
	// never blocks); queued says whether it still waits in its queue.
	picked chan choice
	queued bool
}

// flowQueue is one backend's waiting requests on the node.
type flowQueue struct {
	bands []*band // highest priority first
	n     int
}

// band is the waiting requests of one priority, by tenant in turn.
type band struct {
	priority int
	tenants  map[string][]*waiter
	order    []string // tenants with requests waiting, in turn
	next     int      // order's index of the tenant whose turn it is
}

func (q *flowQueue) len() int { return q.n }

// push adds w at the end of its tenant's queue.
func (q *flowQueue) push(w *waiter) {
	i, found := slices.BinarySearchFunc(q.bands, w.req.priority, func(b *band, p int) int { return p - b.priority })
	if !found {
		q.bands = slices.Insert(q.bands, i, &band{priority: w.req.priority, tenants: map[string][]*waiter{}})
	}
	b := q.bands[i]
	if len(b.tenants[w.req.tenant]) == 0 {
		// A tenant new to the band takes its turn last.
		b.order = slices.Insert(b.order, b.next, w.req.tenant)
		b.next = (b.next + 1) % len(b.order)
	}
	b.tenants[w.req.tenant] = append(b.tenants[w.req.tenant], w)
	w.queued = true
	q.n++
}

// head is the request whose turn it is in the highest band: the one with
// the earliest deadline, if any states one (earliest deadline first, as
// llm-d orders waiting requests by their objectives), else the first of
// the tenant in turn; nil when none waits.
func (q *flowQueue) head() *waiter {
	if q.n == 0 {
		return nil
	}
	b := q.bands[0]
	var first *waiter
	for _, t := range b.order {
		for _, w := range b.tenants[t] {
			if !w.req.deadline.IsZero() && (first == nil || w.req.deadline.Before(first.req.deadline)) {
				first = w
			}
		}
	}
	if first != nil {
		return first
	}
	return b.tenants[b.order[b.next]][0]
}

// late reports whether req cannot meet its deadline: it falls before now
// plus backend's typical time to first byte here. Called with mu held.
func (p *Picker) late(backend string, req request) bool {
	return !req.deadline.IsZero() && req.deadline.Before(p.now().Add(p.typicalTTFB(backend)))
}

// late are the waiting requests whose deadline falls before now plus
// typical, the time a replica takes to answer at best.
func (q *flowQueue) late(now time.Time, typical time.Duration) []*waiter {
	var out []*waiter
	for _, b := range q.bands {
		for _, t := range b.order {
			for _, w := range b.tenants[t] {
				if !w.req.deadline.IsZero() && w.req.deadline.Before(now.Add(typical)) {
					out = append(out, w)
				}
			}
		}
	}
	return out
}

// remove takes w out of its queue; the tenant in turn moves on when w
// was its request.
func (q *flowQueue) remove(w *waiter) {
	if !w.queued {
		return
	}
	bi := slices.IndexFunc(q.bands, func(b *band) bool { return b.priority == w.req.priority })
	b := q.bands[bi]
	t := w.req.tenant
	ws := b.tenants[t]
	b.tenants[t] = slices.DeleteFunc(ws, func(o *waiter) bool { return o == w })
	w.queued = false
	q.n--
	ti := slices.Index(b.order, t)
	turn := ti == b.next
	if len(b.tenants[t]) == 0 {
		delete(b.tenants, t)
		b.order = slices.Delete(b.order, ti, ti+1)
		if ti < b.next {
			b.next--
		}
	} else if turn {
		b.next++ // dispatched: the next tenant's turn
	}
	if len(b.order) == 0 {
		q.bands = slices.Delete(q.bands, bi, bi+1)
		return
	}
	if b.next >= len(b.order) {
		b.next = 0
	}
}

// victim is the request a full queue refuses to make room for w: the
// newest of the tenant with the most waiting in the lowest band, if that
// band is below w's priority or, at w's, that tenant has more waiting
// than w's; nil: w is refused.
func (q *flowQueue) victim(w *waiter) *waiter {
	if q.n == 0 {
		return nil
	}
	b := q.bands[len(q.bands)-1]
	most := b.order[0]
	for _, t := range b.order[1:] {
		if len(b.tenants[t]) > len(b.tenants[most]) {
			most = t
		}
	}
	ws := b.tenants[most]
	if b.priority < w.req.priority || b.priority == w.req.priority && most != w.req.tenant && len(ws) > len(b.tenants[w.req.tenant])+1 {
		return ws[len(ws)-1]
	}
	return nil
}

// queue is backend's queue. Called with mu held.
func (p *Picker) queue(backend string) *flowQueue {
	return entryOf(p.queues, backend, func() *flowQueue { return &flowQueue{} })
}

// flowControl is backend's flow control, as the desired state has it.
func (p *Picker) flowControl(backend string) meshspec.LoadAware {
	_, flow := p.backendSettings(backend)
	return flow
}

// Dispatch gives backend's free replicas to the requests waiting, in turn.
func (p *Picker) Dispatch(backend string) {
	pol, _ := p.backendSettings(backend)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dispatch(backend, pol)
}

// dispatchAll dispatches every backend with requests waiting: what
// saturates a replica also changes with its server's figures and their
// age, which no request's end announces. Scrape calls it on each tick.
func (p *Picker) dispatchAll() {
	p.mu.Lock()
	var waiting []string
	for b, q := range p.queues {
		if q.len() > 0 {
			waiting = append(waiting, b)
		}
	}
	p.mu.Unlock()
	for _, b := range waiting {
		p.Dispatch(b)
	}
}

// dispatch places backend's waiting requests, in turn, while replicas are
// free. Called with mu held.
func (p *Picker) dispatch(backend string, pol policy) {
	q := p.queues[backend]
	if pol.refuseLate && q != nil {
		for _, w := range q.late(p.now(), p.typicalTTFB(backend)) {
			q.remove(w)
			w.picked <- choice{shed: true, why: shedLate}
		}
	}
	for q != nil && q.len() > 0 {
		w := q.head()
		c, ok := p.place(backend, w.req, pol)
		if !ok {
			return
		}
		q.remove(w)
		w.picked <- c
	}
}

// wait is w's pick once a replica takes it, or a shed when it has waited
// timeout; or none when ctx ends first (Envoy gave up on the request).
func (p *Picker) wait(ctx context.Context, w *waiter, timeout time.Duration) choice {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case c := <-w.picked:
		return c
	case <-ctx.Done():
	case <-t.C:
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !w.queued { // dispatched meanwhile: the answer is there (a
		// replica the request never reaches is done when its stream ends)
		return <-w.picked
	}
	p.queue(w.backend).remove(w)
	if ctx.Err() != nil {
		return choice{}
	}
	return choice{shed: true, why: shedTimedOut}
}

// Waiting is, by backend, how many requests wait for a replica on the
// node: in its queue here and, as the servers' fresh figures say, in the
// replicas' own queues (what autoscaling on queue depth reads).
func (p *Picker) Waiting() map[string]float64 {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	out := map[string]float64{}
	for b, q := range p.queues {
		if q.len() > 0 {
			out[b] += float64(q.len())
		}
	}
	for _, r := range p.replicas {
		if r.Server.HasWaiting && r.Fresh(now) {
			out[r.backend] += r.Server.Waiting
		}
	}
	return out
}
