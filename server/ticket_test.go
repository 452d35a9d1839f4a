package server_test

import (
	"encoding/json"
	"net"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/server"
)

// sideChannel sends line to the arena side channel at path and returns
// the reply's error ("" for none) and whether a descriptor came with it
// (closed at once).
func sideChannel(t *testing.T, path, line string) (string, bool) {
	t.Helper()
	nc, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	c := nc.(*net.UnixConn)
	defer c.Close()
	if _, err := c.Write([]byte(line + "\n")); err != nil {
		t.Fatal(err)
	}
	buf, oob := make([]byte, 4096), make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		t.Fatal(err)
	}
	got := false
	if oobn > 0 {
		msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
		for _, m := range msgs {
			fds, _ := unix.ParseUnixRights(&m)
			for _, fd := range fds {
				unix.Close(fd)
				got = true
			}
		}
	}
	var reply struct {
		Error string `json:"error"`
	}
	if err := json.Unmarshal(buf[:n], &reply); err != nil {
		t.Fatalf("reply %q: %v", buf[:n], err)
	}
	return reply.Error, got
}

func ticketLine(ns, tk string) string {
	b, _ := json.Marshal(map[string]string{"namespace": ns, "ticket": tk})
	return string(b)
}

// TestArenaTickets: on a daemon with tokens the side channel hands out an
// arena's descriptor only against a ticket of an authenticated GetArena
// or EngineAttach — once, for its namespace — so a process that can reach
// the socket but holds no token maps nothing. A daemon without tokens
// needs no ticket.
func TestArenaTickets(t *testing.T) {
	acme := server.TenantConfig{Name: "acme", Token: "acme-token-0123456789", Namespaces: []string{""}}
	e := startEnv(t, envOptions{token: "admin-token-0123456789", tenants: []server.TenantConfig{acme}})
	ctx := ctxT(t)
	side := e.unix + ".arena"
	admin := e.dial(t, e.unix)
	issue := func() string {
		t.Helper()
		info, err := admin.API().GetArena(ctx, &kvtierv1.GetArenaRequest{})
		if err != nil || len(info.GetTicket()) != 32 {
			t.Fatalf("GetArena: %v %v", info, err)
		}
		return info.GetTicket()
	}

	if msg, fd := sideChannel(t, side, ""); fd || !strings.Contains(msg, "ticket") {
		t.Fatalf("no ticket: %q, descriptor %v", msg, fd)
	}
	tk := issue()
	if msg, fd := sideChannel(t, side, ticketLine("", tk)); !fd || msg != "" {
		t.Fatalf("a good ticket: %q, descriptor %v", msg, fd)
	}
	if msg, fd := sideChannel(t, side, ticketLine("", tk)); fd || !strings.Contains(msg, "does not open") {
		t.Fatalf("a used ticket: %q, descriptor %v", msg, fd)
	}
	if msg, fd := sideChannel(t, side, ticketLine("other", issue())); fd || !strings.Contains(msg, "does not open") {
		t.Fatalf("another namespace's ticket: %q, descriptor %v", msg, fd)
	}
	for _, forged := range []string{"00112233445566778899aabbccddeeff", strings.Repeat("a", 4096), "x"} {
		if msg, fd := sideChannel(t, side, ticketLine("", forged)); fd || msg == "" {
			t.Fatalf("forged ticket %.40q: %q, descriptor %v", forged, msg, fd)
		}
	}
	if msg, fd := sideChannel(t, side, `{"namespace": "", "ticket": 7}`); fd || msg == "" {
		t.Fatalf("a malformed request: %q, descriptor %v", msg, fd)
	}
	// A tenant gets no ticket: the arena holds every tenant's bytes.
	tc, err := client.Dial(e.unix, client.Options{Token: acme.Token})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	if _, err := tc.API().GetArena(ctx, &kvtierv1.GetArenaRequest{}); err == nil {
		t.Fatal("a tenant's GetArena answered")
	}
	// The client's MapArena takes its ticket on its own.
	a, err := admin.MapArena(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	m := scrapeUntil(t, e, func(p string) bool {
		v, _ := metricValue(p, "kvtier_auth_refusals_total", `listener="arena"`)
		return v >= 4
	})
	if v, _ := metricValue(m, "kvtier_auth_refusals_total", `listener="arena"`, `reason="ticket"`); v < 4 {
		t.Fatalf("arena refusals counted: %v", v)
	}

	open := startEnv(t, envOptions{})
	info, err := open.dial(t, open.unix).API().GetArena(ctx, &kvtierv1.GetArenaRequest{})
	if err != nil || info.GetTicket() != "" {
		t.Fatalf("a daemon without tokens issues no ticket: %v %v", info, err)
	}
	if msg, fd := sideChannel(t, open.unix+".arena", ""); !fd || msg != "" {
		t.Fatalf("without tokens, a name alone: %q, descriptor %v", msg, fd)
	}
	f, err := client.ReceiveArenaFD(ctx, open.unix+".arena", "", "")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
}
