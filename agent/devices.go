package agent

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/servemesh/servemesh/wire"
)

// devices hands out the node's devices of each named resource (its
// --resource gpu=2: devices 0 and 1) to replicas, each device to one live
// replica at a time: a replica gets the lowest free indexes, and frees them
// when its process is stopped for good. The controller never places more
// than a node offers (draining replicas included), so a replica finds its
// devices free; an agent that restarts claims the very devices its
// adopted replicas hold.
type devices struct {
	mu    sync.Mutex
	owner map[string][]string // resource -> device index -> replica tag ("" free)
}

func newDevices(offered map[string]int) *devices {
	d := &devices{owner: map[string][]string{}}
	for name, n := range offered {
		d.owner[name] = make([]string, n)
	}
	return d
}

// take gives tag want devices of each resource, all or none.
func (d *devices) take(tag string, want map[string]int) (map[string][]int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	got := map[string][]int{}
	for name, n := range want {
		for i, owner := range d.owner[name] {
			if len(got[name]) < n && owner == "" {
				got[name] = append(got[name], i)
			}
		}
		if len(got[name]) < n {
			return nil, fmt.Errorf("replica %s needs %d %s, and %d of this node's %d are free", tag, n, name, len(got[name]), len(d.owner[name]))
		}
	}
	for name, idx := range got {
		for _, i := range idx {
			d.owner[name][i] = tag
		}
	}
	return got, nil
}

// claim gives tag the very devices got (an adopted replica's), failing if
// one is not free or not offered.
func (d *devices) claim(tag string, got map[string][]int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for name, idx := range got {
		for _, i := range idx {
			if i < 0 || i >= len(d.owner[name]) || d.owner[name][i] != "" {
				return fmt.Errorf("replica %s holds %s %d, which this node does not offer or another replica holds", tag, name, i)
			}
		}
	}
	for name, idx := range got {
		for _, i := range idx {
			d.owner[name][i] = tag
		}
	}
	return nil
}

// release frees tag's devices.
func (d *devices) release(tag string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, owners := range d.owner {
		for i, owner := range owners {
			if owner == tag {
				owners[i] = ""
			}
		}
	}
}

// deviceEnv is the environment that gives a replica its devices:
// wire.ResourceEnv per resource, and CUDA_VISIBLE_DEVICES for gpu.
func deviceEnv(got map[string][]int) map[string]string {
	env := map[string]string{}
	for name, idx := range got {
		sort.Ints(idx)
		list := make([]string, len(idx))
		for i, n := range idx {
			list[i] = strconv.Itoa(n)
		}
		env[wire.ResourceEnv(name)] = strings.Join(list, ",")
		if name == "gpu" {
			env["CUDA_VISIBLE_DEVICES"] = env[wire.ResourceEnv(name)]
		}
	}
	return env
}
