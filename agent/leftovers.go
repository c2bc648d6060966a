package agent

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// killLeftovers kills what a previous incarnation of this node's agent left
// running: when an agent is killed (SIGKILL), each replica's own process
// dies with it (Pdeathsig), but the processes that one started live on.
// They carry the replica's environment, so they are found by
// SERVEMESH_NODE=<node>, SERVEMESH_AGENT=<agentMark(node, dir)> and a
// SERVEMESH_REPLICA_TAG, and killed with their process groups. Nothing
// is adopted: the replicas themselves are gone. It returns the pids it
// killed.
func killLeftovers(node, dir string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var killed []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		environ, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil || !isReplicaOf(environ, node, dir) {
			continue
		}
		if pgid, err := syscall.Getpgid(pid); err == nil && pgid > 1 {
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
		killed = append(killed, pid)
	}
	return killed
}

// agentMarkVar carries agentMark in a replica's environment.
const agentMarkVar = "SERVEMESH_AGENT"

// agentMark tells the replicas of the agent of node working in dir from
// another agent's, without telling a replica where that folder is: a hash
// of both.
func agentMark(node, dir string) string {
	sum := sha256.Sum256([]byte(node + "\x00" + dir))
	return hex.EncodeToString(sum[:12])
}

// isReplicaOf reports whether a process environment (NUL-separated) is that
// of a replica of the agent of node working in dir.
func isReplicaOf(environ []byte, node, dir string) bool {
	hasNode, hasDir, hasTag := false, false, false
	for _, kv := range bytes.Split(environ, []byte{0}) {
		s := string(kv)
		hasNode = hasNode || s == "SERVEMESH_NODE="+node
		hasDir = hasDir || s == agentMarkVar+"="+agentMark(node, dir)
		hasTag = hasTag || strings.HasPrefix(s, "SERVEMESH_REPLICA_TAG=")
	}
	return hasNode && hasDir && hasTag
}
