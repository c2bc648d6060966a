package api

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"syscall"
)

// ErrUnreachable means no controller answered at an address: nothing
// listens there, or the name does not resolve.
var ErrUnreachable = errors.New("no controller answers")

// transportError is a call that reached no controller, or whose answer was
// lost on the way: worth sending again, elsewhere or later.
type transportError struct{ err error }

func (e *transportError) Error() string { return e.err.Error() }
func (e *transportError) Unwrap() error { return e.err }

// explain turns a transport error of a call to base into one that names
// the address once and says what to check: a controller that is not
// running, HTTP against HTTPS and back, a certificate the client cannot
// verify; those are final. Other errors (a reset, a timeout) are
// transportErrors, without the URL Go's HTTP client repeats in them.
func explain(method, path, base string, err error) error {
	var urlErr *url.Error
	if !errors.As(err, &urlErr) {
		return err
	}
	cause := urlErr.Err
	where := fmt.Sprintf("%s %s at %s", method, path, base)
	var unknownCA x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var verify *tls.CertificateVerificationError
	var dnsErr *net.DNSError
	switch {
	case errors.Is(cause, syscall.ECONNREFUSED):
		return &transportError{fmt.Errorf("%s: %w (connection refused): is a controller running there? Give its address with --server or $SERVEMESH_SERVER", where, ErrUnreachable)}
	case errors.As(cause, &dnsErr):
		return &transportError{fmt.Errorf("%s: %w (%s does not resolve): check the address in --server or $SERVEMESH_SERVER", where, ErrUnreachable, dnsErr.Name)}
	case errors.As(cause, &unknownCA) || (errors.As(cause, &verify) && strings.Contains(verify.Error(), "unknown authority")):
		return fmt.Errorf("%s: the controller's certificate is signed by a CA this client does not trust: give that CA's certificate with --ca-file or $SERVEMESH_CA_FILE (%w)", where, cause)
	case errors.As(cause, &hostname):
		return fmt.Errorf("%s: the controller's certificate is not for %q: use one of the names it is for in --server (%w)", where, hostname.Host, cause)
	case strings.Contains(cause.Error(), "server gave HTTP response to HTTPS client"):
		return fmt.Errorf("%s: the controller serves plain HTTP, not HTTPS: use %s in --server", where, strings.Replace(base, "https://", "http://", 1))
	}
	return &transportError{fmt.Errorf("%s: %w", where, cause)} // reset, EOF, timeout
}

// httpToHTTPS is what Go's HTTPS servers answer to a plain HTTP request.
const httpToHTTPS = "Client sent an HTTP request to an HTTPS server."

// explainAnswer returns the error for an answer of status with body that
// is not the API's: an HTTPS controller asked in plain HTTP says so in a
// 400 of its own.
func explainAnswer(method, path, base string, status int, body string) error {
	if status == 400 && strings.Contains(body, httpToHTTPS) {
		return fmt.Errorf("%s %s at %s: the controller serves HTTPS: use %s in --server (and --ca-file if a private CA signed its certificate)",
			method, path, base, strings.Replace(base, "http://", "https://", 1))
	}
	return nil
}
