package dataplane

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/servemesh/servemesh/meshspec"
)

// Resolver resolves the DNS names of replicas the operator allowed
// (meshspec.AddressPolicy.Names), so the data plane is given addresses, never
// names: Envoy resolving a name itself would connect to whatever it
// resolves to next, loopback included. The view asks for a name's
// addresses (Addrs) and never waits: a name it has not resolved yet is left
// out, resolved in the background, and Changed fires when it is, as it
// does whenever a name's addresses change on a later refresh.
type Resolver struct {
	lookup  func(ctx context.Context, host string) ([]netip.Addr, error)
	every   time.Duration
	timeout time.Duration
	changed chan struct{}

	mu    sync.Mutex
	names map[string]*resolution
}

type resolution struct {
	addrs   []netip.Addr
	err     error
	done    bool // resolved at least once
	running bool
	asked   bool // asked for since the last refresh
}

// NewResolver returns a Resolver using lookup (nil: the system's resolver),
// refreshing the names asked for every refresh (0: 30 s).
func NewResolver(lookup func(ctx context.Context, host string) ([]netip.Addr, error), refresh time.Duration) *Resolver {
	if lookup == nil {
		lookup = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	if refresh == 0 {
		refresh = 30 * time.Second
	}
	return &Resolver{lookup: lookup, every: refresh, timeout: 5 * time.Second, changed: make(chan struct{}, 1),
		names: map[string]*resolution{}}
}

// Changed receives when a name's addresses changed.
func (r *Resolver) Changed() <-chan struct{} {
	if r == nil {
		return nil
	}
	return r.changed
}

// Addrs returns host's addresses as last resolved, and whether it has been
// resolved; the first call for a host starts resolving it.
func (r *Resolver) Addrs(host string) ([]netip.Addr, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	res := r.names[host]
	if res == nil {
		res = &resolution{}
		r.names[host] = res
		r.start(host, res)
	}
	res.asked = true
	return res.addrs, res.done, res.err
}

// start resolves host in the background; called with mu held.
func (r *Resolver) start(host string, res *resolution) {
	if res.running {
		return
	}
	res.running = true
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
		addrs, err := r.lookup(ctx, host)
		cancel()
		for i := range addrs {
			addrs[i] = addrs[i].Unmap()
		}
		slices.SortFunc(addrs, netip.Addr.Compare)
		addrs = slices.Compact(addrs)
		r.mu.Lock()
		changed := !res.done || !slices.Equal(addrs, res.addrs) || (err == nil) != (res.err == nil)
		res.addrs, res.err, res.done, res.running = addrs, err, true, false
		r.mu.Unlock()
		if changed {
			select {
			case r.changed <- struct{}{}:
			default:
			}
		}
	}()
}

// Run refreshes the names asked for since the last refresh, and forgets the
// others, until ctx ends.
func (r *Resolver) Run(ctx context.Context) error {
	t := time.NewTicker(r.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		r.mu.Lock()
		for host, res := range r.names {
			if !res.asked {
				delete(r.names, host)
				continue
			}
			res.asked = false
			r.start(host, res)
		}
		r.mu.Unlock()
	}
}

// resolveNames replaces b's replicas named by DNS with one replica per
// address the name resolves to that policy allows; the others, and names
// not resolved yet, are dropped with the reason. Without a resolver the
// names are kept for Envoy to resolve (tests of the translation only).
func resolveNames(b *meshspec.Backend, names *Resolver, policy meshspec.AddressPolicy, dropped []Dropped) []Dropped {
	if names == nil || !b.ResolvedByDNS() {
		return dropped
	}
	var out []meshspec.Replica
	for _, rep := range b.Replicas {
		if !rep.ByName() {
			out = append(out, rep)
			continue
		}
		host, port, _ := net.SplitHostPort(rep.Address)
		if err := policy.Check(rep.Address); err != nil { // a name stored before the operator's leave was needed
			dropped = append(dropped, Dropped{Backend: b.Name, Instance: rep.Address, Reason: err.Error()})
			continue
		}
		addrs, done, err := names.Addrs(host)
		switch {
		case !done:
			dropped = append(dropped, Dropped{Backend: b.Name, Instance: rep.Address, Reason: "resolving " + host})
		case err != nil:
			dropped = append(dropped, Dropped{Backend: b.Name, Instance: rep.Address, Reason: fmt.Sprintf("resolving %s: %v", host, err)})
		}
		for _, ip := range addrs {
			if err := policy.CheckIP(ip); err != nil {
				dropped = append(dropped, Dropped{Backend: b.Name, Instance: rep.Address,
					Reason: fmt.Sprintf("%s resolves to %s: %v", host, ip, err)})
				continue
			}
			p, _ := strconv.Atoi(port)
			r := rep
			r.Address = netip.AddrPortFrom(ip, uint16(p)).String()
			if !slices.ContainsFunc(out, func(o meshspec.Replica) bool { return o.Address == r.Address }) {
				out = append(out, r)
			}
		}
	}
	b.Replicas = out
	return dropped
}
