package devconsul

import (
	"context"
	"net"
	"strconv"
	"testing"
)

// TestStartsAgainWhenAPortWasTaken: a port chosen free can be taken before
// Consul binds it (make test beside make flake: "bind: address already in
// use", and the test failed). The agent is started again on new ports.
func TestStartsAgainWhenAPortWasTaken(t *testing.T) {
	taken, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = taken.Close() }()
	_, text, _ := net.SplitHostPort(taken.Addr().String())
	port, _ := strconv.Atoi(text)
	free := choosePorts
	chosen := 0
	choosePorts = func(httpPort int) ([]int, error) {
		chosen++
		ports, err := free(httpPort)
		if chosen == 1 && err == nil {
			ports[0] = port // the first choice's HTTP port is taken meanwhile
		}
		return ports, err
	}
	defer func() { choosePorts = free }()
	c, err := StartWith(t.TempDir(), Options{})
	if err != nil {
		t.Fatalf("start with its first HTTP port taken: %v", err)
	}
	defer c.Stop()
	if chosen != 2 || c.HTTPAddr == taken.Addr().String() {
		t.Fatalf("ports chosen %d times, HTTP at %s (taken: %s); want a second choice", chosen, c.HTTPAddr, taken.Addr())
	}
}
