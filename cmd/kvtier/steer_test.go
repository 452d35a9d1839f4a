package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// residency against a daemon as `kvtier serve` builds it: a prompt's keys
// from its token ids, a block in the primary and on disk, then on disk
// only, and nothing changed by asking.
func TestResidencyAgainstADaemon(t *testing.T) {
	d := startOpsDaemon(t)
	sock := "--target=" + d.unix
	prompt := "[1,2,3,4,5,6,7,8,9,10,11,12]\n"
	code, out, errOut := runCLI(t, prompt, "keys", "--block-size", "4")
	if code != 0 {
		t.Fatalf("keys: exit %d, %s", code, errOut)
	}
	var kl keysLine
	if err := json.Unmarshal([]byte(out), &kl); err != nil || len(kl.Keys) != 3 {
		t.Fatalf("keys: %q %v", out, err)
	}
	path, _ := blockFile(t, d.dir, 3, 4096)
	for _, k := range kl.Keys[:2] {
		if code, _, errOut := runCLI(t, "", "put", sock, k, path); code != 0 {
			t.Fatalf("put: %s", errOut)
		}
	}
	waitFor(t, func() bool {
		st, err := d.c.Stats(ctxFor(t))
		return err == nil && st.GetTiers()[0].GetCascadesOk() >= 2
	})
	code, out, errOut = runCLI(t, prompt, "residency", sock, "--tokens", "-", "--block-size", "4")
	if want := "3 keys: loadable 2, primary 2, local-disk 2\n"; code != 0 || out != want {
		t.Fatalf("residency --tokens: exit %d, %q (%s), want %q", code, out, errOut, want)
	}
	if err := d.c.Reset(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	for range 2 { // asking twice: the first asked nothing to move
		code, out, _ = runCLI(t, strings.Join(kl.Keys, " ")+"\n", "residency", sock, "--keys", "-", "--json")
		var l residencyLine
		if err := json.Unmarshal([]byte(out), &l); code != 0 || err != nil {
			t.Fatalf("residency --json: exit %d, %q", code, out)
		}
		if l.Primary != 0 || l.Loadable != 2 || l.Tiers[0].Run != 2 || !l.Tiers[0].Known {
			t.Fatalf("after a reset: %+v", l)
		}
	}
	// Prefetch: the fs tier checks existence asynchronously, so the first
	// answer waits; the daemon's own steps land the blocks.
	code, out, errOut = runCLI(t, prompt, "prefetch", sock, "--tokens", "-", "--block-size", "4", "--deadline", "1m")
	if code != 0 || !strings.HasPrefix(out, "3 keys: 0 present, ") {
		t.Fatalf("prefetch: exit %d, %q %s", code, out, errOut)
	}
	waitFor(t, func() bool {
		_, out, _ := runCLI(t, prompt, "residency", sock, "--tokens", "-", "--block-size", "4")
		return out == "3 keys: loadable 2, primary 2, local-disk 2\n"
	})
	code, out, _ = runCLI(t, prompt, "prefetch", sock, "--tokens", "-", "--block-size", "4")
	if want := "3 keys: 2 present, 0 promotions started, done\n"; code != 0 || out != want {
		t.Fatalf("prefetch again: %q, want %q", out, want)
	}
	// Pins: the two blocks stay through a reset; unpin releases them.
	code, out, _ = runCLI(t, prompt, "pin", sock, "--ttl", "1h", "--tokens", "-", "--block-size", "4")
	if want := "3 keys: 2 pinned, 1 missing, 0 refused\n"; code != 0 || out != want {
		t.Fatalf("pin: %q, want %q", out, want)
	}
	if err := d.c.Reset(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	if _, out, _ := runCLI(t, "", "stats", sock); !strings.Contains(out, "2 blocks pinned by routers") {
		t.Fatalf("stats does not show the pins: %s", out)
	}
	code, out, _ = runCLI(t, prompt, "unpin", sock, "--tokens", "-", "--block-size", "4")
	if want := "3 keys: 2 unpinned\n"; code != 0 || out != want {
		t.Fatalf("unpin: %q, want %q", out, want)
	}
	if err := d.c.Reset(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	// Delete: out of the primary and the disk, nothing left to find.
	code, out, _ = runCLI(t, prompt, "delete", sock, "--tokens", "-", "--block-size", "4")
	if want := "3 keys: primary 0 removed, 0 held, local-disk 2 removed\n"; code != 0 || out != want {
		t.Fatalf("delete: %q, want %q", out, want)
	}
	code, out, _ = runCLI(t, prompt, "residency", sock, "--tokens", "-", "--block-size", "4")
	if want := "3 keys: loadable 0, primary 0, local-disk 0\n"; code != 0 || out != want {
		t.Fatalf("residency after delete: %q, want %q", out, want)
	}
	// --all is a key space's: the admin names a tenant, and keys do not go with it.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"delete", sock, "--all"}, "names the tenant"},
		{[]string{"delete", sock, "--all", kl.Keys[0]}, "name no keys"},
		{[]string{"delete", sock, "--tenant", "acme", kl.Keys[0]}, "--tenant goes with --all"},
	} {
		if code, _, errOut := runCLI(t, "", tc.args...); code == 0 || !strings.Contains(errOut, tc.want) {
			t.Fatalf("%v: exit %d, %q, want %q", tc.args, code, errOut, tc.want)
		}
	}
	code, out, _ = runCLI(t, "", "residency", sock, "--params", `{"kv_load_tiers":[]}`, kl.Keys[0])
	if want := "1 keys: loadable 0, primary 0, local-disk not allowed\n"; code != 0 || out != want {
		t.Fatalf("residency with no tier allowed: %q, want %q", out, want)
	}
	if code, _, errOut := runCLI(t, "", "residency", sock); code == 0 || !strings.Contains(errOut, "name the prefix one way") {
		t.Fatalf("no prefix: exit %d, %q", code, errOut)
	}
	if code, _, errOut := runCLI(t, "{\"keys\": [\"zz\"]}\n", "residency", sock, "--keys", "-"); code == 0 || !strings.Contains(errOut, "line 1") {
		t.Fatalf("a bad key: exit %d, %q", code, errOut)
	}
}
