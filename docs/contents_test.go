package docs

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// contents is the table of contents of a Markdown file's ## and ###
// headings (outside code blocks), linked by GitHub's anchors.
func contents(markdown string) string {
	var b strings.Builder
	fenced := false
	for _, line := range strings.Split(markdown, "\n") {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
			continue
		}
		level := 0
		switch {
		case fenced:
		case strings.HasPrefix(line, "## "):
			level = 2
		case strings.HasPrefix(line, "### "):
			level = 3
		}
		if level == 0 {
			continue
		}
		title := strings.TrimSpace(line[level+1:])
		if title == "Contents" {
			continue
		}
		b.WriteString(strings.Repeat("  ", level-2) + "- [" + title + "](#" + anchor(title) + ")\n")
	}
	return b.String()
}

var notInAnchors = regexp.MustCompile(`[^a-z0-9 _-]`)

// anchor is GitHub's anchor of a heading: lower case, punctuation
// dropped, spaces as hyphens.
func anchor(title string) string {
	return strings.ReplaceAll(notInAnchors.ReplaceAllString(strings.ToLower(title), ""), " ", "-")
}

// TestReadmeContentsAreItsHeadings: README.md's table of contents, between
// its contents markers (after the set-up it opens with), lists its
// headings as they are, so a newcomer finds the sections of a long page
// (issue 62, 7).
func TestReadmeContentsAreItsHeadings(t *testing.T) {
	data, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- contents -->\n", "<!-- /contents -->\n"
	text := string(data)
	i, j := strings.Index(text, begin), strings.Index(text, end)
	if i < 0 || j < i {
		t.Fatalf("README.md has no %q ... %q block", strings.TrimSpace(begin), strings.TrimSpace(end))
	}
	got := text[i+len(begin) : j]
	if want := contents(text); got != want {
		t.Errorf("README.md's contents are not its headings; put this between the markers:\n%s", want)
	}
}
