package proc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// FreeAddr returns host:port with a port nothing listens on right now and
// that no servemesh process of this user on this machine handed out in
// the last HandedOutFor. Ports are drawn from just below the kernel's
// ephemeral range (ip_local_port_range), which the kernel never hands to
// a bind to port 0 or to an outgoing connection, and the hand-outs are
// kept in one file per user (ClaimsFile) that every process reads and
// writes under a lock. So neither another process's kernel-chosen port
// (Jaeger's, an Envoy's upstream connection) nor another servemesh
// process's FreeAddr (two agents' replicas, a test and the demo stack it
// starts) can take the port before its caller binds it.
func FreeAddr(ctx context.Context, host string) (string, error) {
	lo, hi := fixedRange()
	for range freeAddrTries {
		addr, err := candidate(ctx, host, lo, hi)
		if errors.Is(err, syscall.EADDRINUSE) {
			continue
		}
		if err != nil {
			return "", err
		}
		if handedOut.claim(portOf(addr), time.Now()) {
			return addr, nil
		}
	}
	return "", fmt.Errorf("find a free port on %s: %d ports in a row were in use or handed out in the last %s (see %s)", host, freeAddrTries, HandedOutFor, handedOut.path)
}

// HandedOutFor is how long FreeAddr keeps a port it returned from being
// returned again: long enough for its caller to bind it.
const HandedOutFor = time.Minute

const freeAddrTries = 200

// fixedSpan is how many ports below the kernel's ephemeral range FreeAddr
// draws from; floorPort is the lowest it goes (well-known and registered
// services' ports, Consul's 8300-8600 among them, lie below).
const (
	fixedSpan = 16384
	floorPort = 10000
)

// fixedRange is the ports [lo, hi) FreeAddr draws from, or 0, 0 to let
// the kernel choose (a machine whose ephemeral range leaves too few
// below it).
func fixedRange() (lo, hi int) {
	hi = ephemeralLow()
	lo = max(hi-fixedSpan, floorPort)
	if hi-lo < 1024 {
		return 0, 0
	}
	return lo, hi
}

// ephemeralLow is the first port of the kernel's ephemeral range (32768,
// Linux's default, when it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	fields := strings.Fields(string(b))
	if len(fields) == 0 {
		return 32768
	}
	low, err := strconv.Atoi(fields[0])
	if err != nil {
		return 32768
	}
	return low
}

// candidate is a port on host that nothing listens on now: a random one
// in [lo, hi), or the kernel's pick when the range is empty. It is
// EADDRINUSE if the port drawn is taken.
func candidate(ctx context.Context, host string, lo, hi int) (string, error) {
	port := 0
	if hi > lo {
		port = lo + rand.IntN(hi-lo)
	}
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return "", fmt.Errorf("find a free port on %s: %w", host, err)
	}
	addr := l.Addr().String()
	return addr, l.Close()
}

func portOf(addr string) int {
	_, p, _ := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(p)
	return n
}

// handedOut is every process's record of the ports FreeAddr returned.
var handedOut = newPortClaims(filepath.Join(os.TempDir(), "servemesh-ports-"+strconv.Itoa(os.Getuid())))

// portClaims records ports handed out and when, in a file shared by this
// user's processes (a line "port unix-milliseconds" each, rewritten under
// flock), and in this process's memory, which alone serves when the file
// cannot be used.
type portClaims struct {
	path string
	mu   sync.Mutex
	mem  map[int]time.Time
}

func newPortClaims(path string) *portClaims {
	return &portClaims{path: path, mem: map[int]time.Time{}}
}

// claim records port as handed out at now, unless this process or
// another handed it out in the last HandedOutFor.
func (c *portClaims) claim(port int, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	forget(c.mem, now)
	if _, ok := c.mem[port]; ok {
		return false
	}
	ok, err := c.claimInFile(port, now)
	if err != nil {
		ok = true // this process's memory alone
	}
	if ok {
		c.mem[port] = now
	}
	return ok
}

// forget drops the claims older than HandedOutFor (or from a clock that
// has since gone back by more).
func forget(at map[int]time.Time, now time.Time) {
	for p, t := range at {
		if now.Sub(t) >= HandedOutFor || t.Sub(now) >= HandedOutFor {
			delete(at, p)
		}
	}
}

// claimInFile is claimIn on the shared file, under an exclusive lock.
func (c *portClaims) claimInFile(port int, now time.Time) (bool, error) {
	f, err := os.OpenFile(c.path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return false, fmt.Errorf("open the port claims: %w", err)
	}
	defer func() { _ = f.Close() }() // also releases the lock
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return false, fmt.Errorf("lock the port claims: %w", err)
	}
	at := readClaims(f)
	forget(at, now)
	if _, ok := at[port]; ok {
		return false, nil
	}
	at[port] = now
	var b strings.Builder
	for p, t := range at {
		fmt.Fprintf(&b, "%d %d\n", p, t.UnixMilli())
	}
	if err := f.Truncate(0); err != nil {
		return false, fmt.Errorf("write the port claims: %w", err)
	}
	if _, err := f.WriteAt([]byte(b.String()), 0); err != nil {
		return false, fmt.Errorf("write the port claims: %w", err)
	}
	return true, nil
}

// readClaims parses the claims file; a line it cannot read is skipped.
func readClaims(f *os.File) map[int]time.Time {
	at := map[int]time.Time{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var port int
		var ms int64
		if _, err := fmt.Sscan(sc.Text(), &port, &ms); err == nil {
			at[port] = time.UnixMilli(ms)
		}
	}
	return at
}
