// Package configfile owns the declarative config file: it loads a YAML model
// from disk, validates it, and watches the file so that every saved change is
// applied, while an invalid edit is reported and leaves the last good model
// in place.
//
// In the flow of docs/architecture.md: step 1 (the state a file declares
// enters where the API's operations do).
package configfile
