package benchenv

import (
	"fmt"
	"slices"
	"time"
)

// Percentile is the p-th percentile (nearest rank) of ds, which it does
// not reorder.
func Percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// Millis renders d in whole milliseconds: "1417 ms".
func Millis(d time.Duration) string {
	return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
}
