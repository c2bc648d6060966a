package meshspec

import (
	"errors"
	"fmt"
	"strings"

	goccy "github.com/goccy/go-yaml"
	goccyparser "github.com/goccy/go-yaml/parser"
)

// syntaxError says where a file that is not YAML goes wrong. The parser
// that reads files (yaml.v3, through checkShape) names the line where the
// enclosing block begins, and no column; goccy/go-yaml's parser names the
// line and column of the mistake, and this shows them in the file's lines.
// err is yaml.v3's error, said as it is where goccy/go-yaml finds nothing.
func syntaxError(data []byte, err error) (out error) {
	defer func() {
		// A second parser's fault on a file the first refused must not
		// take a daemon with it: say the first one's error.
		if recover() != nil {
			out = fmt.Errorf("the file is not valid YAML: %w", err)
		}
	}()
	_, perr := goccyparser.ParseBytes(data, 0)
	var ye goccy.Error
	if !errors.As(perr, &ye) || ye.GetToken() == nil {
		return fmt.Errorf("the file is not valid YAML: %w", err)
	}
	at := ye.GetToken().Position
	// FormatError's first line repeats the message as "[line:column] ...";
	// the lines after it are the file's, the mistake marked.
	_, lines, _ := strings.Cut(goccy.FormatError(perr, false, true), "\n")
	return fmt.Errorf("the file is not valid YAML: line %d, column %d: %s\n%s", at.Line, at.Column, ye.GetMessage(), strings.TrimRight(lines, "\n"))
}
