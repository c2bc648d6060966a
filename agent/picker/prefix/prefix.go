// Package prefix is the picker's approximate view of its replicas' prefix
// caches, pure: a request's prompt cut into blocks, each named by a hash
// chained over the blocks before it (as vLLM names its KV-cache blocks,
// so one hash stands for the whole prefix up to its block), and, per
// replica, an LRU index of the blocks it recently served. No clock, no
// I/O; the picker (agent/picker) holds an Index per replica under its
// lock. It is off the flow of docs/architecture.md, a part of step 9's
// picker.
package prefix

import (
	"container/list"
	"encoding/json"
	"hash/fnv"
)

// BlockBytes is a block's size in bytes of prompt text: vLLM's 16 tokens
// at about 4 bytes a token.
const BlockBytes = 64

// MaxBlocks bounds the blocks read of one prompt (64 KiB of text): what a
// request costs the picker, whatever its size.
const MaxBlocks = 1024

// Blocks are the chained hashes of body's prompt, one per whole block of
// blockBytes: an OpenAI-style body's messages (each role and content) or
// prompt, else the body itself (one that is not JSON, or a JSON body
// buffered only in part). A last partial block is left out, as vLLM
// caches only whole blocks.
func Blocks(body []byte, blockBytes int) []uint64 {
	text := promptText(body)
	n := min(len(text)/blockBytes, MaxBlocks)
	out := make([]uint64, 0, n)
	h := fnv.New64a()
	for i := range n {
		// Chained: the hash so far absorbs each block, so a block's
		// hash names the prefix that ends with it.
		_, _ = h.Write(text[i*blockBytes : (i+1)*blockBytes])
		out = append(out, h.Sum64())
	}
	return out
}

// promptText is what of body a server's prefix cache keys: the messages'
// roles and contents in order, or the prompt.
func promptText(body []byte) []byte {
	var req struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
		Prompt json.RawMessage `json:"prompt"`
	}
	if json.Unmarshal(body, &req) != nil {
		return body
	}
	var out []byte
	for _, m := range req.Messages {
		out = append(out, m.Role...)
		out = append(out, 0)
		out = append(out, text(m.Content)...)
		out = append(out, 0)
	}
	if len(out) == 0 {
		out = append(out, text(req.Prompt)...)
	}
	return out
}

// text is a JSON string's text, or any other JSON value as it is written
// (a content's parts, a prompt's tokens).
func text(raw json.RawMessage) []byte {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []byte(s)
	}
	return raw
}

// TokensPerBlock is how many of a server's tokens a block stands for:
// BlockBytes at about 4 bytes a token (the Inference Extension's prefix
// scorer's estimate too).
const TokensPerBlock = 16

// DefaultIndexBlocks is how many blocks an Index holds when nothing says
// how much the replica's cache holds: 16,384 (262,144 tokens, ~1.5 MB of
// index).
const DefaultIndexBlocks = 16384

// MaxIndexBlocks bounds an Index, whatever a server reports or a backend
// sets: 262,144 blocks (4,194,304 tokens, ~25 MB of index per replica).
const MaxIndexBlocks = 262144

// BlocksOfTokens is the index capacity for a cache of tokens: a block per
// TokensPerBlock, from 1 to MaxIndexBlocks.
func BlocksOfTokens(tokens int) int {
	return min(max(tokens/TokensPerBlock, 1), MaxIndexBlocks)
}

// Index is the blocks one replica recently served, least recently used
// forgotten first. Not safe for concurrent use.
type Index struct {
	capacity int
	order    *list.List // of uint64, most recent first
	at       map[uint64]*list.Element
}

// NewIndex returns an empty index of at most capacity blocks.
func NewIndex(capacity int) *Index {
	return &Index{capacity: max(capacity, 1), order: list.New(), at: map[uint64]*list.Element{}}
}

// Match is how many of blocks, from the first, the index holds: the
// prefix the replica is expected to have cached.
func (x *Index) Match(blocks []uint64) int {
	for i, b := range blocks {
		if _, ok := x.at[b]; !ok {
			return i
		}
	}
	return len(blocks)
}

// Add records that the replica served blocks: each becomes the most
// recent (the first the most recent of all, as a server keeps a prefix's
// first blocks longest), and the least recent are forgotten past the
// index's capacity.
func (x *Index) Add(blocks []uint64) {
	for i := len(blocks) - 1; i >= 0; i-- {
		if e, ok := x.at[blocks[i]]; ok {
			x.order.MoveToFront(e)
			continue
		}
		x.at[blocks[i]] = x.order.PushFront(blocks[i])
	}
	x.evict()
}

// evict forgets the least recent blocks past the capacity.
func (x *Index) evict() {
	for x.order.Len() > x.capacity {
		last := x.order.Back()
		delete(x.at, last.Value.(uint64))
		x.order.Remove(last)
	}
}

// Resize makes capacity the index's bound (at least 1), forgetting the
// least recent blocks past it.
func (x *Index) Resize(capacity int) {
	x.capacity = max(capacity, 1)
	x.evict()
}

// Capacity is the index's bound, in blocks.
func (x *Index) Capacity() int { return x.capacity }

// Len is how many blocks the index holds.
func (x *Index) Len() int { return x.order.Len() }

// Blocks are the blocks the index holds, most recent first: what Add
// takes to hold them again in the same order (a picker's checkpoint).
func (x *Index) Blocks() []uint64 {
	out := make([]uint64, 0, x.order.Len())
	for e := x.order.Front(); e != nil; e = e.Next() {
		out = append(out, e.Value.(uint64))
	}
	return out
}
