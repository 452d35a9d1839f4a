package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
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
	"github.com/kvtier/kvtier/tlsconfig"
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
	tokenFile string
	namespace string
	timeout   time.Duration
	// TLS to a TCP daemon whose API serves it (server.tls).
	tls                                   bool
	tlsCA, tlsCert, tlsKey, tlsServerName string
}

func (f *remoteFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.target, "target", "./kvtier.sock", "daemon address: a Unix socket path, unix://PATH, or HOST:PORT")
	fl.StringVar(&f.token, "token", "", "auth token (default $KVTIER_TOKEN); visible to other users in ps: prefer --token-file")
	fl.StringVar(&f.tokenFile, "token-file", "", "file holding the auth token, mode 0600 (default $KVTIER_TOKEN_FILE)")
	fl.StringVar(&f.namespace, "namespace", "", "daemon namespace (default: the default namespace)")
	fl.DurationVar(&f.timeout, "timeout", 10*time.Second, "bound on the whole command")
	fl.BoolVar(&f.tls, "tls", false, "talk TLS to a TCP daemon (server.tls), trusting the system's roots; implied by the --tls-* flags")
	fl.StringVar(&f.tlsCA, "tls-ca", "", "PEM file of the CA that signed the daemon's certificate (default $KVTIER_TLS_CA)")
	fl.StringVar(&f.tlsCert, "tls-cert", "", "PEM client certificate, for a daemon that wants one (server.tls.client_ca_file; default $KVTIER_TLS_CERT)")
	fl.StringVar(&f.tlsKey, "tls-key", "", "PEM key of --tls-cert (default $KVTIER_TLS_KEY)")
	fl.StringVar(&f.tlsServerName, "tls-server-name", "", "name to check the daemon's certificate against instead of the host dialled (default $KVTIER_TLS_SERVER_NAME)")
}

// tlsConfig is the TLS configuration the flags (or $KVTIER_TLS_*) ask
// for; nil without any.
func (f *remoteFlags) tlsConfig() (*tls.Config, error) {
	env := func(v *string, name string) {
		if *v == "" {
			*v = os.Getenv(name)
		}
	}
	env(&f.tlsCA, "KVTIER_TLS_CA")
	env(&f.tlsCert, "KVTIER_TLS_CERT")
	env(&f.tlsKey, "KVTIER_TLS_KEY")
	env(&f.tlsServerName, "KVTIER_TLS_SERVER_NAME")
	if !f.tls && f.tlsCA == "" && f.tlsCert == "" && f.tlsKey == "" && f.tlsServerName == "" {
		return nil, nil
	}
	if _, unix := client.IsUnixTarget(f.target); unix {
		return nil, fmt.Errorf("--target %q is a Unix socket: TLS applies to a TCP daemon (HOST:PORT)", f.target)
	}
	if (f.tlsCert == "") != (f.tlsKey == "") {
		return nil, errors.New("--tls-cert and --tls-key go together")
	}
	c, err := tlsconfig.Client(f.tlsCA, f.tlsCert, f.tlsKey, f.tlsServerName)
	if err != nil {
		return nil, fmt.Errorf("--tls-*: %w", err)
	}
	return c, nil
}

// resolveToken returns the token the flags or the environment give:
// --token, --token-file, $KVTIER_TOKEN, $KVTIER_TOKEN_FILE, in that order.
func (f *remoteFlags) resolveToken() (string, error) {
	if f.token != "" && f.tokenFile != "" {
		return "", errors.New("--token and --token-file: give one")
	}
	file := f.tokenFile
	switch {
	case f.token != "":
		return f.token, nil
	case file != "":
	case os.Getenv("KVTIER_TOKEN") != "":
		return os.Getenv("KVTIER_TOKEN"), nil
	default:
		file = os.Getenv("KVTIER_TOKEN_FILE")
	}
	if file == "" {
		return "", nil
	}
	tok, err := readToken(file)
	if err != nil {
		return "", fmt.Errorf("--token-file: %w", err)
	}
	return tok, nil
}

// dial connects to the daemon. The connection is lazy: the first call
// reports an unreachable daemon (see rpcError).
func (f *remoteFlags) dial() (*client.Client, error) {
	tok, err := f.resolveToken()
	if err != nil {
		return nil, err
	}
	tc, err := f.tlsConfig()
	if err != nil {
		return nil, err
	}
	c, err := client.Dial(f.target, client.Options{Token: tok, Namespace: f.namespace, TLS: tc})
	if err != nil {
		return nil, fmt.Errorf("--target %q: %w", f.target, err)
	}
	return c, nil
}

// tlsTrouble explains a transport error that a TLS handshake (or its
// absence) caused, or returns "".
func (f *remoteFlags) tlsTrouble(msg string) string {
	why := f.tlsCause(msg)
	switch {
	case why == "":
		return ""
	case strings.HasPrefix(why, "the daemon closed"):
		return fmt.Sprintf("no answer from %s: %s", f.target, why)
	}
	return fmt.Sprintf("TLS handshake with %s failed: %s", f.target, why)
}

func (f *remoteFlags) tlsCause(msg string) string {
	usingTLS := f.tls || f.tlsCA != "" || f.tlsCert != "" || f.tlsServerName != ""
	switch {
	case strings.Contains(msg, "certificate signed by unknown authority"):
		return "the daemon's TLS certificate is not signed by a CA this client trusts (--tls-ca names the daemon's CA)"
	case strings.Contains(msg, "certificate is valid for"), strings.Contains(msg, "doesn't contain any IP SANs"),
		strings.Contains(msg, "not valid for any names"):
		return "the daemon's TLS certificate is not for the name dialled (--tls-server-name sets the name to check)"
	case strings.Contains(msg, "certificate required"), strings.Contains(msg, "bad certificate"):
		return "the daemon wants a TLS client certificate signed by its server.tls.client_ca_file (--tls-cert and --tls-key)"
	case strings.Contains(msg, "unknown certificate authority"):
		return "the daemon does not trust the client certificate's CA (server.tls.client_ca_file)"
	case usingTLS && (strings.Contains(msg, "broken pipe") || strings.Contains(msg, "connection reset by peer")):
		// The daemon's alert raced the client's first write.
		cert := "(--tls-cert and --tls-key)"
		if f.tlsCert != "" {
			cert = "(or does not trust the one sent)"
		}
		return "the daemon broke off the TLS connection, as one that wants a TLS client certificate signed by its server.tls.client_ca_file does " + cert
	case strings.Contains(msg, "first record does not look like a TLS handshake"):
		return "the daemon does not serve TLS on this address (drop --tls-*)"
	case !usingTLS && (strings.Contains(msg, "error reading server preface") || strings.Contains(msg, "connection reset by peer") ||
		strings.Contains(msg, "EOF")):
		return "the daemon closed the connection without a word: if it serves TLS (server.tls), pass --tls-ca (and --tls-cert/--tls-key for mutual TLS)"
	}
	return ""
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
		if why := f.tlsTrouble(st.Message()); why != "" {
			return fmt.Errorf("%s: %s: %s", what, why, st.Message())
		}
		return fmt.Errorf("%s: cannot reach a kvtier daemon at %s (is `kvtier serve` running there? --target sets the address): %s", what, f.target, st.Message())
	case codes.Unauthenticated:
		return fmt.Errorf("%s: the daemon at %s wants an auth token (--token-file, --token, $KVTIER_TOKEN_FILE or $KVTIER_TOKEN): %s", what, f.target, st.Message())
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
