package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/servemesh/servemesh/controlplane/api"
)

// TestLogsShowAndFollow: each replica's lines come after its tag; with
// --follow each log is read on from its offset until Ctrl-C (the
// context), a replica placed since is picked up from its start, and a log
// that cannot be read is said on stderr while the others are printed.
func TestLogsShowAndFollow(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	reads := 0
	logs := map[string]string{"m#000001": "a1\na2\n", "m#000002": "b1\n"}
	read := func(_ context.Context, tag string, tail int, offset int64) (api.LogsReport, error) {
		reads++
		if reads == 3 {
			logs["m#000001"] += "a3\n" // written meanwhile
		}
		if reads == 8 {
			logs["m#000003"] = "c1\n" // placed meanwhile
		}
		if reads > 20 {
			cancel()
		}
		var r api.LogsReport
		for _, name := range []string{"m#000001", "m#000002", "m#000003"} {
			text, ok := logs[name]
			if !ok || tag != "" && tag != name {
				continue
			}
			if name == "m#000002" && offset >= 0 {
				r.Logs = append(r.Logs, api.LogChunk{Replica: name, Node: "n2", Error: "connection refused", Offset: offset})
				continue
			}
			from := max(offset, 0)
			if offset < 0 && tail == 0 {
				from = int64(len(text))
			}
			r.Logs = append(r.Logs, api.LogChunk{Replica: name, Node: "n1", Text: text[from:], Offset: int64(len(text))})
		}
		return r, nil
	}
	var out, errOut bytes.Buffer
	lf := logsFlags{tail: 20, follow: true, interval: time.Millisecond}
	if err := lf.show(ctx, &out, &errOut, read); err != nil {
		t.Fatal(err)
	}
	want := "[m#000001] a1\n[m#000001] a2\n[m#000002] b1\n[m#000001] a3\n[m#000003] c1\n"
	if out.String() != want {
		t.Errorf("followed:\n%s\nwant:\n%s", out.String(), want)
	}
	if !bytes.Contains(errOut.Bytes(), []byte("servemesh logs: replica m#000002 on node n2: connection refused")) {
		t.Errorf("stderr: %q", errOut.String())
	}
	// One log alone, not followed: no tags.
	out.Reset()
	lf = logsFlags{tail: 20, replica: "m#000001", interval: time.Second}
	if err := lf.show(context.Background(), &out, &errOut, read); err != nil || out.String() != "a1\na2\na3\n" {
		t.Errorf("one log: %q %v", out.String(), err)
	}
}
