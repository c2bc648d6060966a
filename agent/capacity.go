package agent

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// MemoryMB reads the machine's memory from /proc/meminfo: what an agent
// offers its replicas unless told otherwise. It is 1024 when unknown.
func MemoryMB() int { return memoryMB("/proc/meminfo") }

func memoryMB(path string) int {
	f, err := os.Open(path)
	if err != nil {
		return 1024
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")))
			if err == nil {
				return kb / 1024
			}
		}
	}
	return 1024
}
