package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"

	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// LogsRefused answers every read of a log 403, saying why: an agent whose
// status listener takes no token (it may, on loopback) serves no log,
// which any user of the host, a replica included, could read otherwise:
// another replica's log may print its environment.
func LogsRefused() http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "this agent serves logs only to its status token: give it --status-token-file and the controller --agent-token-file", http.StatusForbidden)
	}
}

// LogsHandler serves wire.LogsPath: the log of a replica this agent runs
// (its file in workDir, as replica.go writes it) or of the node's Envoy
// (envoyLog), its last lines or what follows an offset, bounded. Only a
// replica tag names a file, so no request reaches another path.
func LogsHandler(workDir, envoyLog string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		path := envoyLog
		if tag := q.Get("replica"); q.Get("envoy") != "true" {
			if !meshspec.IsReplicaTag(tag) {
				http.Error(w, fmt.Sprintf("replica %q: name a replica by its tag (<backend>#<6 hex digits>), or ask for envoy=true", tag), http.StatusBadRequest)
				return
			}
			path = filepath.Join(workDir, wire.ReplicaServiceID(tag)+".log")
		}
		tail, offset, err := logRange(q.Get("tail"), q.Get("offset"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		text, next, err := readLog(path, tail, offset)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			http.Error(w, "no such log on this node: the replica runs elsewhere, or has not started", http.StatusNotFound)
			return
		case err != nil:
			http.Error(w, "read the log: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set(wire.LogOffsetHeader, strconv.FormatInt(next, 10))
		_, _ = w.Write(text)
	}
}

// logRange reads ?tail= (lines, 100 by default) and ?offset= (bytes; -1
// when not given: the tail is read).
func logRange(tailArg, offsetArg string) (tail int, offset int64, err error) {
	tail, offset = 100, -1
	if tailArg != "" {
		if tail, err = strconv.Atoi(tailArg); err != nil || tail < 0 || tail > wire.MaxLogTail {
			return 0, 0, fmt.Errorf("tail %q: lines from 0 to %d", tailArg, wire.MaxLogTail)
		}
	}
	if offsetArg != "" {
		if offset, err = strconv.ParseInt(offsetArg, 10, 64); err != nil || offset < 0 {
			return 0, 0, fmt.Errorf("offset %q: a byte offset, 0 or more", offsetArg)
		}
	}
	return tail, offset, nil
}

// readLog reads path's last tail lines (offset < 0) or what follows
// offset, at most wire.MaxLogBytes, and returns the offset to read on
// from. A log shorter than offset was rotated: it is read from its start.
func readLog(path string, tail int, offset int64) ([]byte, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer func() { _ = f.Close() }()
	info, err := f.Stat()
	if err != nil {
		return nil, 0, err
	}
	size := info.Size()
	from := offset
	switch {
	case offset < 0:
		from = max(0, size-wire.MaxLogBytes)
	case offset > size:
		from = 0
	}
	text, err := io.ReadAll(io.LimitReader(io.NewSectionReader(f, from, size-from), wire.MaxLogBytes))
	if err != nil {
		return nil, 0, err
	}
	next := from + int64(len(text))
	if offset < 0 {
		text = lastLines(text, tail)
	}
	return text, next, nil
}

// lastLines is text's last n lines.
func lastLines(text []byte, n int) []byte {
	text = bytes.TrimSuffix(text, []byte("\n"))
	if len(text) == 0 || n == 0 {
		return nil
	}
	i := len(text)
	for range n {
		j := bytes.LastIndexByte(text[:i], '\n')
		if j < 0 {
			return append(text, '\n')
		}
		i = j
	}
	return append(text[i+1:], '\n')
}
