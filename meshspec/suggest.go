package meshspec

import (
	"fmt"
	"slices"
	"strings"
)

// MaxSuggested is how many known names Suggest lists at most.
const MaxSuggested = 10

// Suggest is what to tell someone who named a kind ("backend",
// "endpoint") by a name that is not one of known: the known name nearest
// to it, if it looks misspelt, and the known names, so that the fix is in
// the message: `did you mean "model-v1"? backends: model-v1, model-v2`.
func Suggest(kind, name string, known []string) string {
	if len(known) == 0 {
		return fmt.Sprintf("there are no %ss yet", kind)
	}
	known = slices.Sorted(slices.Values(known))
	list := strings.Join(known[:min(len(known), MaxSuggested)], ", ")
	if len(known) > MaxSuggested {
		list += fmt.Sprintf(", ... (%d in all: servemesh %s list shows them)", len(known), kind)
	}
	if best := closest(name, known); best != "" {
		return fmt.Sprintf("did you mean %q? %ss: %s", best, kind, list)
	}
	return fmt.Sprintf("%ss: %s", kind, list)
}
