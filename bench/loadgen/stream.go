package loadgen

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"time"
)

// Streamed is one streamed response read whole: when its first token and
// its last arrived.
type Streamed struct {
	First, Last time.Time
}

// Stream GETs url, a response of tokens lines "token <i>" (the demo
// replica's ?tokens=N), and reads it line by line as it arrives; it wants
// 200 and every token, in order.
func Stream(c *http.Client, url string, tokens int) (Streamed, error) {
	var s Streamed
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
	if err != nil {
		return s, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return s, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("status %d", resp.StatusCode)
	}
	lines := bufio.NewScanner(resp.Body)
	for i := range tokens {
		if !lines.Scan() {
			if err := lines.Err(); err != nil {
				return s, fmt.Errorf("the stream broke after %d of %d tokens: %w", i, tokens, err)
			}
			return s, fmt.Errorf("the stream ended after %d of %d tokens", i, tokens)
		}
		if i == 0 {
			s.First = time.Now()
		}
		if want := fmt.Sprintf("token %d", i); lines.Text() != want {
			return s, fmt.Errorf("token %d: got %q, want %q", i, lines.Text(), want)
		}
	}
	s.Last = time.Now()
	return s, nil
}
