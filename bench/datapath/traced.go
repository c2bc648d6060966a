package main

import (
	"context"
	"fmt"
	"io/fs"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/servemesh/servemesh/envoy"
)

// tracedShare is, for every Envoy under work (by its admin socket), the
// share of its HTTP requests that it traced, from its connection managers'
// tracing counters (random_sampling, service_forced and client_enabled are
// traced; not_traceable is not): "public 1.0% inbound 100%". It tells a
// sampling that traces more than asked from a cost that every request
// pays, traced or not.
func tracedShare(work string) string {
	var socks []string
	_ = filepath.WalkDir(work, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && (d.Name() == "admin.sock" || d.Name() == "envoy.sock") {
			socks = append(socks, path)
		}
		return nil
	})
	slices.Sort(socks)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []string
	for _, sock := range socks {
		stats, err := envoy.Admin{Socket: sock}.Stats(ctx, `^http\..*\.tracing\.`)
		if err != nil {
			out = append(out, fmt.Sprintf("%s: %v", sock, err))
			continue
		}
		traced, all := map[string]uint64{}, map[string]uint64{}
		for name, v := range stats { // http.<prefix>.tracing.<counter>
			parts := strings.Split(name, ".")
			if len(parts) < 4 {
				continue
			}
			prefix, counter := parts[1], parts[len(parts)-1]
			switch counter {
			case "random_sampling", "service_forced", "client_enabled":
				traced[prefix] += v
				all[prefix] += v
			case "not_traceable":
				all[prefix] += v
			}
		}
		rel, _ := filepath.Rel(work, filepath.Dir(sock))
		for _, prefix := range slices.Sorted(maps.Keys(all)) {
			if all[prefix] > 0 {
				out = append(out, fmt.Sprintf("%s %s %.1f%% of %d", rel, prefix, 100*float64(traced[prefix])/float64(all[prefix]), all[prefix]))
			}
		}
	}
	return strings.Join(out, "; ")
}
