package fs

import "testing"

func TestODirectProbe(t *testing.T) {
	tier := newTier(t, t.TempDir(), nil)
	t.Logf("O_DIRECT on %s: %v", t.TempDir(), tier.Direct())
	off := newTier(t, t.TempDir(), func(c *Config) { c.ODirect = "off" })
	if off.Direct() {
		t.Fatal("o_direct: off used O_DIRECT")
	}
	if tier.Direct() {
		// "on" must then start as well.
		newTier(t, t.TempDir(), func(c *Config) { c.ODirect = "on" })
	} else if _, err := New(testConfig(t.TempDir(), func(c *Config) { c.ODirect = "on" })); err == nil {
		t.Fatal("o_direct: on started without O_DIRECT support")
	}
}
