package bootstrap

import (
	"fmt"
	"net"
	"strconv"
)

func splitHostPort(field, hostport string) (string, uint32, error) {
	host, portText, err := net.SplitHostPort(hostport)
	if err != nil {
		return "", 0, fmt.Errorf("bootstrap: %s %q is not host:port: %w", field, hostport, err)
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil || port == 0 || host == "" {
		return "", 0, fmt.Errorf("bootstrap: %s %q needs a host and a port between 1 and 65535", field, hostport)
	}
	return host, uint32(port), nil
}
