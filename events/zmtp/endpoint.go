package zmtp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
)

// ErrEndpoint reports an endpoint this package cannot serve.
var ErrEndpoint = errors.New("zmtp: unsupported endpoint")

// ParseEndpoint maps a ZeroMQ endpoint to a Go network and address:
// tcp://host:port (host "*" = all interfaces, port "*" or 0 = any) and
// ipc://path (ipc://@name for Linux's abstract namespace).
func ParseEndpoint(endpoint string) (network, address string, err error) {
	scheme, rest, ok := strings.Cut(endpoint, "://")
	if !ok || rest == "" {
		return "", "", fmt.Errorf("%w: %q (want tcp://host:port or ipc://path)", ErrEndpoint, endpoint)
	}
	switch scheme {
	case "tcp":
		host, port, err := net.SplitHostPort(rest)
		if err != nil {
			return "", "", fmt.Errorf("%w: %q: %v", ErrEndpoint, endpoint, err)
		}
		if host == "*" {
			host = ""
		}
		if port == "*" {
			port = "0"
		}
		return "tcp", net.JoinHostPort(host, port), nil
	case "ipc":
		return "unix", rest, nil
	}
	return "", "", fmt.Errorf("%w: %q (scheme %s; only tcp and ipc)", ErrEndpoint, endpoint, scheme)
}

// listen binds endpoint. A stale ipc socket file is replaced, as libzmq
// does, so that a restarted daemon can bind the same path.
func listen(endpoint string) (net.Listener, error) {
	network, addr, err := ParseEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	if network == "unix" && !strings.HasPrefix(addr, "@") {
		if fi, err := os.Lstat(addr); err == nil && fi.Mode()&os.ModeSocket != 0 {
			_ = os.Remove(addr)
		}
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(context.Background(), network, addr)
	if err != nil {
		return nil, fmt.Errorf("zmtp: bind %s: %w", endpoint, err)
	}
	if ul, ok := ln.(*net.UnixListener); ok {
		ul.SetUnlinkOnClose(true)
	}
	return ln, nil
}

func dial(ctx context.Context, endpoint string) (net.Conn, error) {
	network, addr, err := ParseEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, fmt.Errorf("zmtp: connect %s: %w", endpoint, err)
	}
	return nc, nil
}
