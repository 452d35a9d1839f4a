package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/offload"
)

// The operator commands (put, get, lookup, stats) talk to a running
// daemon. They share the flags below and map the daemon's errors to
// messages that say what to do.

// exitError ends a command with a given exit code; msg, when set, is
// printed on stderr as it is (no "kvtier: " prefix).
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// exitMiss is get's exit code for a block that is not there.
const exitMiss = 3

// remoteFlags are the connection flags of the operator commands.
type remoteFlags struct {
	target    string
	token     string
	namespace string
	timeout   time.Duration
}

func (f *remoteFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.target, "target", "./kvtier.sock", "daemon address: a Unix socket path, unix://PATH, or HOST:PORT")
	fl.StringVar(&f.token, "token", "", "auth token for a TCP daemon (default $KVTIER_TOKEN)")
	fl.StringVar(&f.namespace, "namespace", "", "daemon namespace (default: the default namespace)")
	fl.DurationVar(&f.timeout, "timeout", 10*time.Second, "bound on the whole command")
}

// dial connects to the daemon. The connection is lazy: the first call
// reports an unreachable daemon (see rpcError).
func (f *remoteFlags) dial() (*client.Client, error) {
	tok := f.token
	if tok == "" {
		tok = os.Getenv("KVTIER_TOKEN")
	}
	c, err := client.Dial(f.target, client.Options{Token: tok, Namespace: f.namespace})
	if err != nil {
		return nil, fmt.Errorf("--target %q: %w", f.target, err)
	}
	return c, nil
}

func (f *remoteFlags) context(extra time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), f.timeout+extra)
}

// rpcError explains a failed call in an operator's terms.
func (f *remoteFlags) rpcError(what string, err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("%s: %w", what, err)
	}
	switch st.Code() {
	case codes.Unavailable:
		return fmt.Errorf("%s: cannot reach a kvtier daemon at %s (is `kvtier serve` running there? --target sets the address): %s", what, f.target, st.Message())
	case codes.Unauthenticated:
		return fmt.Errorf("%s: the daemon at %s wants an auth token (--token or $KVTIER_TOKEN): %s", what, f.target, st.Message())
	case codes.DeadlineExceeded:
		return fmt.Errorf("%s: no answer from %s within --timeout %v", what, f.target, f.timeout)
	case codes.NotFound:
		return fmt.Errorf("%s: %s", what, st.Message())
	}
	return fmt.Errorf("%s: %s (%s)", what, st.Message(), st.Code())
}

// paramsFlag reads --params: a kv_transfer_params JSON document, @FILE,
// or - for stdin. It returns "" when unset.
func paramsFlag(v string, stdin io.Reader) (string, error) {
	var raw []byte
	switch {
	case v == "":
		return "", nil
	case v == "-":
		b, err := io.ReadAll(io.LimitReader(stdin, 1<<20))
		if err != nil {
			return "", fmt.Errorf("--params -: %w", err)
		}
		raw = b
	case strings.HasPrefix(v, "@"):
		b, err := os.ReadFile(v[1:])
		if err != nil {
			return "", fmt.Errorf("--params: %w", err)
		}
		raw = b
	default:
		raw = []byte(v)
	}
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err != nil {
		return "", fmt.Errorf("--params: not a JSON object: %w", err)
	}
	return strings.TrimSpace(string(raw)), nil
}

// parseKeys parses KEY arguments (offload.ParseKey).
func parseKeys(args []string) ([]offload.Key, error) {
	keys := make([]offload.Key, len(args))
	for i, a := range args {
		k, err := offload.ParseKey(a)
		if err != nil {
			return nil, err
		}
		keys[i] = k
	}
	return keys, nil
}

// cliRequestID names the temporary request of a command: unique per
// process, so that commands run side by side never share one.
func cliRequestID(cmd string) string {
	return fmt.Sprintf("kvtier-%s-%d-%d", cmd, os.Getpid(), time.Now().UnixNano())
}
