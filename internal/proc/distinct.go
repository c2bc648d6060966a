package proc

import (
	"fmt"
	"net"
	"net/netip"
)

// Listener is an address a daemon listens on, and what it is for (naming
// the flag that sets it, for the error).
type Listener struct {
	What, Addr string
}

// CheckDistinct refuses a daemon's listeners when two would bind the same
// port on overlapping addresses (the same IP, or one of them every IP),
// naming both: the second would otherwise fail to bind later, or (Envoy's)
// be taken for another daemon's. Port 0 (the kernel picks) never clashes.
func CheckDistinct(ls []Listener) error {
	for i, a := range ls {
		for _, b := range ls[i+1:] {
			if overlap(a.Addr, b.Addr) {
				return fmt.Errorf("%s %s and %s %s are the same address: give each listener its own port", a.What, a.Addr, b.What, b.Addr)
			}
		}
	}
	return nil
}

func overlap(a, b string) bool {
	ha, pa, errA := net.SplitHostPort(a)
	hb, pb, errB := net.SplitHostPort(b)
	if errA != nil || errB != nil || pa != pb || pa == "0" {
		return false
	}
	return ha == hb || unspecified(ha) || unspecified(hb)
}

func unspecified(host string) bool {
	if host == "" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsUnspecified()
}
