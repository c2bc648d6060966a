package prefix

import (
	"strings"
	"testing"
)

// TestBlocksNameTheirPrefix: two prompts that share their first blocks
// share those blocks' hashes and no later one; a partial block is left
// out; a chat's messages count, roles included, and a body that is not
// JSON counts as itself.
func TestBlocksNameTheirPrefix(t *testing.T) {
	system := strings.Repeat("s", 3*BlockBytes)
	a := Blocks([]byte(`{"model":"m","messages":[{"role":"system","content":"`+system+`"},{"role":"user","content":"`+strings.Repeat("a", BlockBytes)+`"}]}`), BlockBytes)
	b := Blocks([]byte(`{"temperature":0.5,"messages":[{"role":"system","content":"`+system+`"},{"role":"user","content":"`+strings.Repeat("b", BlockBytes)+`"}]}`), BlockBytes)
	if len(a) != len(b) || len(a) < 4 {
		t.Fatalf("blocks %d and %d, want the same number, at least 4", len(a), len(b))
	}
	shared := 0
	for shared < len(a) && a[shared] == b[shared] {
		shared++
	}
	if shared != 3 {
		t.Fatalf("the prompts share %d blocks' hashes, want 3 (the system prompt's whole blocks)", shared)
	}
	if got := Blocks([]byte(`{"prompt":"`+strings.Repeat("p", BlockBytes-1)+`"}`), BlockBytes); len(got) != 0 {
		t.Fatalf("a prompt shorter than a block has %d blocks", len(got))
	}
	if got := Blocks([]byte(strings.Repeat("x", 2*BlockBytes+5)), BlockBytes); len(got) != 2 {
		t.Fatalf("a body that is not JSON has %d blocks, want 2", len(got))
	}
	huge := Blocks([]byte(`{"prompt":"`+strings.Repeat("h", (MaxBlocks+10)*BlockBytes)+`"}`), BlockBytes)
	if len(huge) != MaxBlocks {
		t.Fatalf("a huge prompt has %d blocks, want at most %d", len(huge), MaxBlocks)
	}
}

// TestIndexKeepsRecentPrefixes: a prefix served is matched whole, a
// longer one up to where it departs, and the least recently served is
// forgotten first past the index's capacity.
func TestIndexKeepsRecentPrefixes(t *testing.T) {
	x := NewIndex(6)
	x.Add([]uint64{1, 2, 3})
	if got := x.Match([]uint64{1, 2, 3, 4}); got != 3 {
		t.Fatalf("matched %d, want 3", got)
	}
	if got := x.Match([]uint64{9, 2, 3}); got != 0 {
		t.Fatalf("matched %d of a prefix that departs at its first block, want 0", got)
	}
	x.Add([]uint64{7, 8, 9})
	x.Add([]uint64{1, 2, 3}) // served again: the most recent
	x.Add([]uint64{10})      // over capacity: 9, the least recent, goes
	if x.Len() != 6 || x.Match([]uint64{7, 8, 9}) != 2 || x.Match([]uint64{1, 2, 3}) != 3 {
		t.Fatalf("after eviction: %d blocks, 7-8-9 matched %d, 1-2-3 %d; want 6, 2, 3", x.Len(), x.Match([]uint64{7, 8, 9}), x.Match([]uint64{1, 2, 3}))
	}
}

// TestIndexResizes: a smaller bound forgets the least recent blocks at
// once, a larger one keeps what is held; a cache's tokens make blocks of
// TokensPerBlock, bounded.
func TestIndexResizes(t *testing.T) {
	x := NewIndex(6)
	x.Add([]uint64{1, 2, 3})
	x.Add([]uint64{4, 5, 6})
	x.Resize(3)
	if x.Len() != 3 || x.Match([]uint64{4, 5, 6}) != 3 || x.Match([]uint64{1}) != 0 {
		t.Fatalf("resized to 3: %d blocks, 4-5-6 matched %d, 1 matched %d; want 3, 3, 0", x.Len(), x.Match([]uint64{4, 5, 6}), x.Match([]uint64{1}))
	}
	x.Resize(10)
	x.Add([]uint64{7, 8, 9})
	if x.Capacity() != 10 || x.Len() != 6 {
		t.Fatalf("resized to 10: capacity %d holding %d; want 10 holding 6", x.Capacity(), x.Len())
	}
	for tokens, want := range map[int]int{0: 1, 65536: 4096, 1 << 40: MaxIndexBlocks} {
		if got := BlocksOfTokens(tokens); got != want {
			t.Errorf("BlocksOfTokens(%d) = %d, want %d", tokens, got, want)
		}
	}
}
