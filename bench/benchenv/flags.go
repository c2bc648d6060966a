package benchenv

import (
	"fmt"
	"strconv"
	"strings"
)

// Counts are the whole numbers, from 1 to most, of a comma-separated flag
// (name, for the error).
func Counts(name, list string, most int) ([]int, error) {
	var out []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > most {
			return nil, fmt.Errorf("-%s: %q is not a count from 1 to %d", name, f, most)
		}
		out = append(out, n)
	}
	return out, nil
}
