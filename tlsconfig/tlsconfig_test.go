package tlsconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestErrorsNameTheProblem(t *testing.T) {
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.pem")
	os.WriteFile(junk, []byte("not a certificate"), 0o600)
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"server without key", func() error { _, err := Server("c.pem", "", ""); return err }(), "both required"},
		{"missing files", func() error { _, err := Server(filepath.Join(dir, "c"), filepath.Join(dir, "k"), ""); return err }(), "no such file"},
		{"client CA not PEM", func() error { _, err := Client(junk, "", "", ""); return err }(), "no PEM certificate"},
		{"client cert without key", func() error { _, err := Client("", "c.pem", "", ""); return err }(), "go together"},
	} {
		if tc.err == nil || !strings.Contains(tc.err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.name, tc.err, tc.want)
		}
	}
	if c, err := Client("", "", "", "node-a"); err != nil || c.ServerName != "node-a" {
		t.Errorf("plain client: %v %v", c, err)
	}
}
