package configfile

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/servemesh/servemesh/controlplane/gatewayapi"
	"github.com/servemesh/servemesh/controlplane/rayserve"
	"github.com/servemesh/servemesh/meshspec"
)

// LoadSpec reads and validates what the file in path declares: a
// servemesh config, and, in more YAML documents (split by "---"),
// Gateway API HTTPRoutes, each an endpoint (gatewayapi.Endpoint).
func LoadSpec(path string) (*meshspec.Spec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config file: %w", err)
	}
	s, err := ParseSpec(data)
	if err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	return s, nil
}

// Loaded is a config file as LoadAny read it: its spec and, for a Ray
// Serve config, that it was one and the notes of its conversion (what it
// left out or chose).
type Loaded struct {
	Spec  *meshspec.Spec
	Ray   bool
	Notes []string
}

// LoadAny reads the file in path: a servemesh config (LoadSpec), or a Ray
// Serve config file, converted with ray (rayserve.Convert; ray.Dir
// defaults to the file's folder).
func LoadAny(path string, ray rayserve.Options) (Loaded, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Loaded{}, fmt.Errorf("read config file: %w", err)
	}
	if ray.Dir == "" {
		if ray.Dir, err = filepath.Abs(filepath.Dir(path)); err != nil {
			return Loaded{}, err
		}
	}
	return ParseAny(path, data, ray)
}

// ParseAny is LoadAny of data, read from what name says ("standard
// input", say); a Ray Serve config's relative paths are from ray.Dir.
func ParseAny(name string, data []byte, ray rayserve.Options) (Loaded, error) {
	if !rayserve.IsConfig(data) {
		s, err := ParseSpec(data)
		if err != nil {
			return Loaded{}, fmt.Errorf("config file %s: %w", name, err)
		}
		return Loaded{Spec: s}, nil
	}
	s, notes, err := rayserve.Convert(data, ray)
	if err == nil {
		err = s.Model().Validate()
	}
	if err != nil {
		return Loaded{}, fmt.Errorf("the Ray Serve config %s: %w", name, err)
	}
	return Loaded{Spec: s, Ray: true, Notes: notes}, nil
}

// ParseSpec reads a config: one servemesh document (meshspec.ParseSpec), or
// several YAML documents of which at most one is servemesh's and the
// others HTTPRoutes.
func ParseSpec(data []byte) (*meshspec.Spec, error) {
	docs := documents(data)
	if len(docs) == 1 && !gatewayapi.IsHTTPRoute(docs[0].data) {
		return meshspec.ParseSpec(docs[0].data)
	}
	s := &meshspec.Spec{}
	own := 0
	for _, d := range docs {
		if gatewayapi.IsHTTPRoute(d.data) {
			e, err := gatewayapi.Endpoint(d.data)
			if err != nil {
				return nil, fmt.Errorf("document %d (line %d): %w", d.index, d.line, err)
			}
			s.Endpoints = append(s.Endpoints, e)
			continue
		}
		if own++; own > 1 {
			return nil, fmt.Errorf("document %d (line %d): a second servemesh document; keep backends and endpoints in one, HTTPRoutes in the others", d.index, d.line)
		}
		mine, err := meshspec.ParseSpec(d.data)
		if err != nil {
			return nil, fmt.Errorf("document %d (line %d): %w", d.index, d.line, err)
		}
		s.Backends = append(s.Backends, mine.Backends...)
		s.Endpoints = append(mine.Endpoints, s.Endpoints...)
		s.Mesh = mine.Mesh
	}
	if err := s.Model().Validate(); err != nil {
		return nil, err
	}
	return s, nil
}

// document is one YAML document of a file: its place (from 1) and first
// line.
type document struct {
	index, line int
	data        []byte
}

// documents splits a file at its "---" lines, dropping empty documents.
func documents(data []byte) []document {
	var out []document
	lines := bytes.SplitAfter(data, []byte("\n"))
	start, first := 0, 1
	flush := func(end, next int) {
		chunk := bytes.Join(lines[start:end], nil)
		if len(bytes.TrimSpace(chunk)) > 0 && !onlyComments(chunk) {
			out = append(out, document{index: len(out) + 1, line: first, data: chunk})
		}
		start, first = next, next+1
	}
	for i, l := range lines {
		if t := bytes.TrimSpace(l); bytes.Equal(t, []byte("---")) || bytes.HasPrefix(t, []byte("--- ")) {
			flush(i, i+1)
		}
	}
	flush(len(lines), len(lines))
	if len(out) == 0 {
		return []document{{index: 1, line: 1, data: data}}
	}
	return out
}

// onlyComments reports whether a document holds nothing but comments.
func onlyComments(doc []byte) bool {
	for _, l := range bytes.Split(doc, []byte("\n")) {
		if t := bytes.TrimSpace(l); len(t) > 0 && t[0] != '#' {
			return false
		}
	}
	return true
}

// Load reads and validates the model in path.
func Load(path string) (*meshspec.Model, error) {
	s, err := LoadSpec(path)
	if err != nil {
		return nil, err
	}
	return s.Model(), nil
}

// settle is how long a changed file must keep its content before it is read.
const settle = 50 * time.Millisecond

// Watcher applies a config file's model whenever its content changes.
type Watcher struct {
	// Path is the config file.
	Path string
	// Interval is how often the file is checked; 250ms when zero.
	Interval time.Duration
	// Apply receives each new valid model; an error from it is logged like a
	// parse error and the file is tried again when it next changes.
	Apply func(*meshspec.Model) error
	// Logger receives the watcher's logs; required.
	Logger *slog.Logger
}

// Run checks the file until ctx ends. It compares content hashes rather than
// modification times, so editors that save by renaming are seen too and a
// save without changes does nothing.
func (w *Watcher) Run(ctx context.Context, lastApplied [32]byte) error {
	interval := w.Interval
	if interval == 0 {
		interval = 250 * time.Millisecond
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	seen := lastApplied
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		data, err := os.ReadFile(w.Path)
		if err != nil {
			continue // mid-save or removed: keep serving, look again
		}
		sum := sha256.Sum256(data)
		if sum == seen {
			continue
		}
		// Apply a change only once the content holds still: an editor that
		// saves in place can be caught between truncating and writing.
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(settle):
		}
		again, err := os.ReadFile(w.Path)
		if err != nil || sha256.Sum256(again) != sum {
			continue // still being written; look again next tick
		}
		seen = sum
		start := time.Now()
		s, err := ParseSpec(data)
		if err == nil {
			err = w.Apply(s.Model())
		}
		if err != nil {
			w.Logger.Error("config file change rejected; the last good config keeps serving", "path", w.Path, "err", err)
			continue
		}
		w.Logger.Info("config file change applied", "path", w.Path, "took", time.Since(start))
	}
}

// LoadForWatch loads the file and returns its model with the content hash to
// pass to Run, so the initial content is not applied twice.
func LoadForWatch(path string) (*meshspec.Model, [32]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, [32]byte{}, fmt.Errorf("read config file: %w", err)
	}
	s, err := ParseSpec(data)
	if err != nil {
		return nil, [32]byte{}, fmt.Errorf("config file %s: %w", path, err)
	}
	return s.Model(), sha256.Sum256(data), nil
}
