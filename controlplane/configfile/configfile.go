package configfile

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/servemesh/servemesh/controlplane/model"
)

// LoadSpec reads and validates what the file in path declares.
func LoadSpec(path string) (*model.Spec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config file: %w", err)
	}
	s, err := model.ParseSpec(data)
	if err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	return s, nil
}

// Load reads and validates the model in path.
func Load(path string) (*model.Model, error) {
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
	Apply func(*model.Model) error
	// Logger receives the watcher's logs; required.
	Logger *slog.Logger
}

// Run checks the file until ctx ends. It compares content hashes rather than
// modification times, so editors that save by renaming are seen too and a
// save without changes does nothing.
func (w *Watcher) Run(ctx context.Context, lastApplied [32]byte) {
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
			return
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
			return
		case <-time.After(settle):
		}
		again, err := os.ReadFile(w.Path)
		if err != nil || sha256.Sum256(again) != sum {
			continue // still being written; look again next tick
		}
		seen = sum
		start := time.Now()
		m, err := model.Parse(data)
		if err == nil {
			err = w.Apply(m)
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
func LoadForWatch(path string) (*model.Model, [32]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, [32]byte{}, fmt.Errorf("read config file: %w", err)
	}
	m, err := model.Parse(data)
	if err != nil {
		return nil, [32]byte{}, fmt.Errorf("config file %s: %w", path, err)
	}
	return m, sha256.Sum256(data), nil
}
