package controller

import (
	"errors"
	"fmt"
)

// Kind classifies an operation's failure for API status codes.
type Kind int

// The kinds of failure.
const (
	// Invalid input: nothing changed (HTTP 400).
	Invalid Kind = iota + 1
	// NotFound: the named backend or endpoint does not exist (HTTP 404).
	NotFound
	// Conflict with the current state, such as a name already taken with a
	// different spec or a backend still in use (HTTP 409).
	Conflict
	// NotLeader: this controller does not take writes (HTTP 503).
	NotLeader
	// Unavailable: the store could not be written; nothing changed (HTTP 503).
	Unavailable
	// Forbidden: the caller may not make this change, such as a new
	// command without the authority to run one (HTTP 403).
	Forbidden
)

// Error is an operation's failure.
type Error struct {
	Kind Kind
	Msg  string
	// Leader is the leader's API address, for NotLeader errors, if known.
	Leader string
	Err    error
	// Shortfall, for a Conflict of placement, is how many replicas found
	// no room (those that fit were placed).
	Shortfall int
}

func (e *Error) Error() string {
	if e.Err != nil {
		return e.Msg + ": " + e.Err.Error()
	}
	return e.Msg
}

func (e *Error) Unwrap() error { return e.Err }

func errorf(kind Kind, format string, args ...any) *Error {
	return &Error{Kind: kind, Msg: fmt.Sprintf(format, args...)}
}

// KindOf returns err's Kind, or 0 if it is not an *Error.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return 0
}
