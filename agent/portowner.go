package agent

import (
	"fmt"

	"github.com/servemesh/servemesh/internal/proc"
)

// A replica's port is where the agent probes it, sends its user_config
// with its reconfigure token, and where its node's Envoy sends its
// requests. While a replica is down (crashing, restarting) another process
// may listen on that port, another backend's replica say: probed in the
// replica's stead, it would be called healthy, be sent the replica's
// config and secret, and take its requests. So the agent checks that the
// socket listening on the port is held by the replica's own process group
// (proc.ListenerInGroup) before it counts a probe or sends a config: once
// per process and port for probes (the port stays its own while its
// process holds it: the kernel lets no other user's socket share it), and
// before every config.

// ownedPort is a replica process's port that was found its own.
type ownedPort struct {
	process proc.Identity
	addr    string
}

// ownsPort fails when another process than the replica's holds its port.
// Nothing listening passes: the probe fails on its own. With again, it
// checks even a port found the process's own before.
func (r *replica) ownsPort(again bool) error {
	id := r.process.Load()
	if id == nil {
		return nil // not started: nothing is probed or sent
	}
	addr := r.address()
	if last := r.owned.Load(); !again && last != nil && last.process == *id && last.addr == addr {
		return nil
	}
	l := proc.ListenerInGroup(addr, id.Pid)
	switch {
	case l.Inode == 0:
		return nil
	case l.InGroup:
		r.owned.Store(&ownedPort{process: *id, addr: addr})
		return nil
	}
	return fmt.Errorf("%s is held by %s, not by the replica's process %d: it is not probed or sent its config until its own process listens there",
		addr, l.Other, id.Pid)
}
