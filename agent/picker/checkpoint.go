package picker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/servemesh/servemesh/agent/picker/placement"
	"github.com/servemesh/servemesh/agent/picker/prefix"
)

// A node's picker learns where prompts and conversations went: each
// replica's prefix index, models and prefill rate, the sessions, and each backend's
// placements of prompts, over its replicas here (spreads) and, as a
// caller, over the backend's nodes (placements). Held in memory alone, an
// agent's restart lost them, and until they were learned again affinity
// fell back to load alone while the replicas, which the new agent adopts,
// still held the prompts. The picker's checkpoint keeps them in the
// agent's folder: written every CheckpointEvery while they change and
// when the agent stops, read when it starts. It holds hashes (of prompts'
// blocks, session ids, affinity keys), never a prompt, a session id or a
// header's value.

// CheckpointFile is the checkpoint's name in the agent's Envoy folder.
const CheckpointFile = "picker-state.json"

// CheckpointEvery is how often a changed checkpoint is written.
const CheckpointEvery = time.Second

// maxCheckpointBytes bounds the checkpoint read: every replica's index at
// its largest is far less.
const maxCheckpointBytes = 256 << 20

// checkpointVersion is the checkpoint's format; another is not read.
const checkpointVersion = 1

// checkpoint is what the picker keeps across its agent's restarts.
type checkpoint struct {
	Version int `json:"version"`
	// Replicas are each replica's prefix index (its blocks, most recent
	// first) and models, by tag.
	Replicas map[string]savedReplica `json:"replicas,omitempty"`
	// Sessions are the conversations, most recently seen first.
	Sessions []savedSession `json:"sessions,omitempty"`
	// Spreads and Placements are each backend's placements of prompts
	// over its replicas here and, as a caller, over its nodes.
	Spreads    map[string][]placement.Entry `json:"spreads,omitempty"`
	Placements map[string][]placement.Entry `json:"placements,omitempty"`
}

type savedReplica struct {
	Backend string   `json:"backend"`
	Blocks  []uint64 `json:"blocks,omitempty"`
	Models  []string `json:"models,omitempty"`
	// PrefillRate is its measured prefill rate (token load), for the
	// backend's spec PrefillSpec (specKey): a replica adopted under
	// another spec measures it afresh.
	PrefillRate float64 `json:"prefill_rate,omitempty"`
	PrefillSpec uint64  `json:"prefill_spec,omitempty"`
}

// snapshot is the picker's checkpoint now. Called with mu held.
func (p *Picker) snapshot() checkpoint {
	cp := checkpoint{Version: checkpointVersion, Replicas: make(map[string]savedReplica, len(p.replicas)), Sessions: p.sessions.saved(),
		Spreads: entriesOf(p.spreads), Placements: entriesOf(p.placements)}
	for tag, r := range p.replicas {
		cp.Replicas[tag] = savedReplica{Backend: r.backend, Blocks: r.cache.Blocks(), Models: r.models.names(),
			PrefillRate: r.PrefillRate, PrefillSpec: r.prefillSpec}
	}
	return cp
}

func entriesOf(tables map[string]*placement.Table) map[string][]placement.Entry {
	out := make(map[string][]placement.Entry, len(tables))
	for backend, t := range tables {
		if e := t.Entries(); len(e) > 0 {
			out[backend] = e
		}
	}
	return out
}

// Restore reads the checkpoint at path, which a previous agent's picker
// wrote (KeepCheckpoint): the sessions and placements at once, and each
// replica's index and models when the agent adopts that replica (Resume),
// whose cache still holds them. No checkpoint is no error; one that cannot
// be read is an error, and the picker starts empty.
func (p *Picker) Restore(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("picker checkpoint: %w", err)
	}
	defer func() { _ = f.Close() }()
	data, err := io.ReadAll(io.LimitReader(f, maxCheckpointBytes+1))
	if err != nil {
		return fmt.Errorf("picker checkpoint %s: %w", path, err)
	}
	if len(data) > maxCheckpointBytes {
		return fmt.Errorf("picker checkpoint %s: larger than %d bytes; it is not read, and the picker learns again", path, maxCheckpointBytes)
	}
	var cp checkpoint
	if err := json.Unmarshal(data, &cp); err != nil {
		return fmt.Errorf("picker checkpoint %s: %w; it is not read, and the picker learns again", path, err)
	}
	if cp.Version != checkpointVersion {
		return fmt.Errorf("picker checkpoint %s: version %d, this agent reads %d; it is not read, and the picker learns again", path, cp.Version, checkpointVersion)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sessions.restore(cp.Sessions)
	restoreTables(p.spreads, cp.Spreads)
	restoreTables(p.placements, cp.Placements)
	p.restored = cp.Replicas
	return nil
}

func restoreTables(tables map[string]*placement.Table, saved map[string][]placement.Entry) {
	for backend, entries := range saved {
		t := entryOf(tables, backend, placement.NewTable)
		t.Restore(entries)
	}
}

// Resume gives a replica the agent adopted, tracked already, the index
// and models the checkpoint holds of it, and its prefill rate while the
// backend's spec is the one it was measured under: its process, and so
// its cache, outlived the agent. A replica the agent started anew resumes
// nothing.
func (p *Picker) Resume(tag string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	saved, ok := p.restored[tag]
	r, tracked := p.replicas[tag]
	if !ok || !tracked || saved.Backend != r.backend {
		return
	}
	delete(p.restored, tag)
	if n := len(saved.Blocks); n > r.cache.Capacity() {
		r.cache.Resize(min(n, prefix.MaxIndexBlocks))
	}
	r.cache.Add(saved.Blocks)
	for i := len(saved.Models) - 1; i >= 0; i-- {
		r.models.use(saved.Models[i], len(saved.Models))
	}
	if saved.PrefillRate > 0 && saved.PrefillSpec == p.specKey(r.backend) {
		r.PrefillRate, r.prefillSpec = saved.PrefillRate, saved.PrefillSpec
	}
}

// KeepCheckpoint writes the picker's checkpoint to path every
// CheckpointEvery while it changes, and once more when ctx ends (the
// agent stops), until then.
func (p *Picker) KeepCheckpoint(ctx context.Context, path string, log *slog.Logger) {
	t := time.NewTicker(CheckpointEvery)
	defer t.Stop()
	written := uint64(0)
	for {
		select {
		case <-ctx.Done():
			if err := p.writeCheckpoint(path, &written); err != nil {
				log.Warn("the picker's last checkpoint was not written; the next agent learns again", "path", path, "err", err)
			}
			return
		case <-t.C:
			if err := p.writeCheckpoint(path, &written); err != nil {
				log.Warn("the picker's checkpoint was not written; it is tried again", "path", path, "err", err)
			}
		}
	}
}

// writeCheckpoint writes the checkpoint if the picker changed since the
// one written (at change *written), whole or not at all.
func (p *Picker) writeCheckpoint(path string, written *uint64) error {
	p.mu.Lock()
	if p.changes == *written {
		p.mu.Unlock()
		return nil
	}
	cp, changes := p.snapshot(), p.changes
	p.mu.Unlock()
	data, err := json.Marshal(cp)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(path, data); err != nil {
		return err
	}
	*written = changes
	return nil
}

// writeFileAtomic writes data to path through a temporary file in its
// folder, readable by its owner alone, renamed over it.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }() // gone once renamed
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// changed counts a change of what the checkpoint holds. Called with mu
// held.
func (p *Picker) changed() { p.changes++ }
