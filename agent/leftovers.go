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
// running and this one does not adopt (replicas whose tag is not in keep,
// and whatever their processes started): they carry the replica's
// environment, so they are found by SERVEMESH_NODE=<node>,
// SERVEMESH_AGENT=<agentMark(node, dir)> and a SERVEMESH_REPLICA_TAG, and
// killed with their process groups. It returns the pids it killed.
func killLeftovers(node, dir string, keep map[string]replicaRecord) []int {
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
		if err != nil {
			continue
		}
		if tag, ok := replicaTagOf(environ, node, dir); !ok || keep[tag].Tag != "" {
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

// replicaTagOf returns the replica tag of a process environment
// (NUL-separated) that is that of a replica of the agent of node working
// in dir; false if it is not.
func replicaTagOf(environ []byte, node, dir string) (string, bool) {
	hasNode, hasDir, tag := false, false, ""
	for _, kv := range bytes.Split(environ, []byte{0}) {
		s := string(kv)
		hasNode = hasNode || s == "SERVEMESH_NODE="+node
		hasDir = hasDir || s == agentMarkVar+"="+agentMark(node, dir)
		if t, ok := strings.CutPrefix(s, "SERVEMESH_REPLICA_TAG="); ok {
			tag = t
		}
	}
	return tag, hasNode && hasDir && tag != ""
}
