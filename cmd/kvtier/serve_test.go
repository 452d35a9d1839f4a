package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// TestServeAddressErrorsNameTheKey: an unusable listen address is a
// start-up error that names its config key, found before any tier is
// built.
func TestServeAddressErrorsNameTheKey(t *testing.T) {
	for _, tc := range []struct{ server, want string }{
		{`tcp_addr: nonsense`, `server.tcp_addr: invalid value "nonsense"`},
		{`tcp_addr: "127.0.0.1:99999"`, `server.tcp_addr: invalid value "127.0.0.1:99999"`},
		{`metrics_addr: "localhost"`, `server.metrics_addr: invalid value "localhost"`},
	} {
		t.Run(tc.server, func(t *testing.T) {
			dir := t.TempDir()
			cfg := writeFile(t, "kvtier.yaml", fmt.Sprintf(`
namespace: {bytes_per_block: 4KiB}
primary: {bytes: 64KiB, arena: {kind: anonymous}}
secondary_tiers: [{name: d, type: fs, root_dir: %s}]
server:
  unix_socket: ""
  %s
`, filepath.Join(dir, "data"), tc.server))
			code, _, stderr := runCLI(t, "", "serve", "--config", cfg)
			if code != 1 || !strings.Contains(stderr, tc.want) {
				t.Fatalf("exit %d, stderr %q; want exit 1 naming %q", code, stderr, tc.want)
			}
		})
	}
}
