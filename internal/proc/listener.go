package proc

import (
	"net"
	"strconv"
	"strings"

	"github.com/prometheus/procfs"
)

// listening reads /proc for the inodes of the TCP sockets listening on
// addr (host:port; a socket on the wildcard address listens on every
// address's port). It returns none when addr cannot be read or /proc is
// not there.
func listening(addr string) (procfs.FS, map[uint64]bool) {
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return procfs.FS{}, nil
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil {
		return procfs.FS{}, nil
	}
	ip := net.ParseIP(host)
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return procfs.FS{}, nil
	}
	inodes := map[uint64]bool{}
	// /proc/net/tcp is slow on a host with very many sockets (hence the
	// deprecation, for sock_diag); its callers read it when a daemon
	// starts or a replica's listener changes, not per request.
	for _, table := range []func() (procfs.NetTCP, error){fs.NetTCP, fs.NetTCP6} { //nolint:staticcheck // read rarely, as above
		lines, err := table()
		if err != nil {
			continue
		}
		for _, l := range lines {
			if l.St == tcpListen && l.LocalPort == port && (l.LocalAddr.Equal(ip) || l.LocalAddr.IsUnspecified() || ip == nil) {
				inodes[l.Inode] = true
			}
		}
	}
	return fs, inodes
}

// holdsAny reports whether process p has one of the sockets inodes open.
func holdsAny(p procfs.Proc, inodes map[uint64]bool) bool {
	targets, err := p.FileDescriptorTargets()
	if err != nil {
		return false // another user's, or gone
	}
	for _, t := range targets {
		inode, found := strings.CutPrefix(t, "socket:[")
		if !found {
			continue
		}
		n, _ := strconv.ParseUint(strings.TrimSuffix(inode, "]"), 10, 64)
		if inodes[n] {
			return true
		}
	}
	return false
}

// GroupListener is who listens on an address, as ListenerInGroup tells
// it: the socket's inode (0 when nothing listens) and, when no process of
// the group holds it, one that does (Holder's PID 0 when none could be
// named).
type GroupListener struct {
	Inode   uint64
	InGroup bool
	Other   Holder
}

// ListenerInGroup reports whether the socket listening on addr is held by
// a process of process group pgid (a child started by Start leads its
// own): a supervisor checks a child's port is the child's before it
// probes or configures it, since another process may have taken the port
// while the child was down. It reads every process's descriptors: callers
// remember what they found (the agent's ownedPort).
func ListenerInGroup(addr string, pgid int) GroupListener {
	fs, inodes := listening(addr)
	if len(inodes) == 0 {
		return GroupListener{}
	}
	var out GroupListener
	for n := range inodes {
		out.Inode = n
	}
	procs, err := fs.AllProcs()
	if err != nil {
		return out
	}
	for _, p := range procs {
		if !holdsAny(p, inodes) {
			continue
		}
		if st, err := p.Stat(); err == nil && st.PGRP == pgid {
			out.InGroup = true
			return out
		}
		comm, _ := p.Comm()
		out.Other = Holder{PID: p.PID, Command: comm}
	}
	return out
}
