package server_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"net"
	"testing"
	"time"

	"pgregory.net/rapid"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/blockstream"
	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/cpu"
	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/server"
)

// TestAdversaryModel is issue 42's acceptance model: an adversary tenant
// (acme) does everything a tenant may to hold on to the primary — fills
// it with borrowed blocks, pins them, opens stream gets it never reads
// (1 MiB blocks: more than the sockets buffer, so their pins stay), opens
// stream puts it never finishes (their reservations stay), floods the
// request table and drops its connections — while a victim (beta) stores
// and reads within its quota. Whatever the interleaving, every put of the
// victim's succeeds, none of its blocks is ever evicted, and every block
// it reads is the one it stored.
func TestAdversaryModel(t *testing.T) {
	// Megabyte blocks make each case costly under the race detector: fewer
	// cases there (the suite runs with -race; a plain go test runs all).
	if f := flag.Lookup("rapid.checks"); raceEnabled && f != nil && f.Value.String() == "100" {
		f.Value.Set("25")
		defer f.Value.Set("100")
	}
	rapid.Check(t, adversaryModel)
}

func adversaryModel(rt *rapid.T) {
	const size = 1 << 20
	slots := rapid.SampledFrom([]int{16, 24}).Draw(rt, "slots") // 16: the quotas leave nothing to borrow
	acmeSp, _ := keyspace.Tenant("acme")
	betaSp, _ := keyspace.Tenant("beta")
	const quota = 8
	e := startEnvSlot(rt, envOptions{
		slots: slots, token: "admin-token", stream: true, tiers: noTiers,
		tenants: []server.TenantConfig{
			{Name: "acme", Token: "acme-token", Namespaces: []string{""}},
			{Name: "beta", Token: "beta-token", Namespaces: []string{""}},
		},
		shares: []cpu.Share{{Space: acmeSp.ID(), Slots: quota}, {Space: betaSp.ID(), Slots: quota}},
	}, size)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dial := func(token string) *client.Client {
		c, err := client.Dial(e.tcp, client.Options{Token: token})
		if err != nil {
			rt.Fatal(err)
		}
		rt.Cleanup(func() { c.Close() })
		return c
	}
	acme, beta, admin := dial("acme-token"), dial("beta-token"), dial("admin-token")
	var raw []net.Conn // the adversary's open stream requests
	rt.Cleanup(func() {
		for _, c := range raw {
			c.Close()
		}
	})
	acmeKey := func(i int) offload.Key { return key(1000 + i) }
	betaKeys := keys(0, quota) // the victim's universe: never more than its quota
	stored := map[offload.Key][]byte{}
	version := 0
	betaEvicted := func() uint64 { return tenantEvictions(rt, admin, "beta") }
	hello := func() net.Conn {
		c, err := net.DialTimeout("tcp", e.srv.StreamAddr(), 5*time.Second)
		if err != nil {
			rt.Fatal(err)
		}
		msg := []byte("KVBS\x01")
		for _, f := range []string{"acme-token", ""} {
			msg = binary.BigEndian.AppendUint16(msg, uint16(len(f)))
			msg = append(msg, f...)
		}
		if _, err := c.Write(msg); err != nil {
			rt.Fatal(err)
		}
		var reply [5]byte
		if _, err := c.Read(reply[:]); err != nil || reply[4] != 0 {
			rt.Fatalf("stream hello: %v %v", reply, err)
		}
		raw = append(raw, c)
		return c
	}
	request := func(flag uint32, ks []offload.Key) []byte {
		req := binary.BigEndian.AppendUint32(nil, uint32(len(ks))|flag)
		for _, k := range ks {
			req = binary.BigEndian.AppendUint16(req, uint16(len(k)))
			req = append(req, k...)
		}
		return req
	}
	acmeKeys := func(rt *rapid.T, most int) []offload.Key {
		n := rapid.IntRange(1, most).Draw(rt, "n")
		first := rapid.IntRange(0, 31).Draw(rt, "first")
		var ks []offload.Key
		for i := range n {
			ks = append(ks, acmeKey((first+i)%32))
		}
		return ks
	}

	rt.Repeat(map[string]func(*rapid.T){
		"adversary put": func(rt *rapid.T) {
			var blocks []client.Block
			for _, k := range acmeKeys(rt, 8) {
				blocks = append(blocks, client.Block{Key: k, Data: bytes.Repeat([]byte{'a'}, size)})
			}
			_, _ = acme.PutBlocks(ctx, blocks, client.CallOptions{}) // refusals are its own business
		},
		"adversary pins": func(rt *rapid.T) {
			_, _ = acme.Pin(ctx, acmeKeys(rt, 8), time.Hour)
		},
		"adversary reads and never takes the bytes": func(rt *rapid.T) {
			_, _ = hello().Write(request(0, acmeKeys(rt, 16)))
		},
		"adversary puts and never sends the blocks": func(rt *rapid.T) {
			_, _ = hello().Write(request(blockstream.PutFlag, acmeKeys(rt, 8)))
		},
		"adversary floods the request table": func(rt *rapid.T) {
			for i := range 32 {
				version++
				if _, err := acme.NewRequest(ctx, fmt.Sprintf("flood-%d-%d", version, i), ""); err != nil {
					break
				}
			}
		},
		"adversary hangs up": func(rt *rapid.T) {
			for _, c := range raw {
				c.Close()
			}
			raw = nil
		},
		"victim put": func(rt *rapid.T) {
			before := betaEvicted()
			var blocks []client.Block
			for _, i := range rapid.SliceOfNDistinct(rapid.IntRange(0, quota-1), 1, 3, rapid.ID[int]).Draw(rt, "keys") {
				version++
				data := bytes.Repeat([]byte{'b'}, size)
				copy(data, fmt.Sprintf("beta|%d|v%d|", i, version))
				blocks = append(blocks, client.Block{Key: betaKeys[i], Data: data})
			}
			written, err := beta.PutBlocks(ctx, blocks, client.CallOptions{})
			if err != nil {
				rt.Fatalf("the victim, within its quota, was refused a put: %v", err)
			}
			for i, b := range blocks {
				if written[i] {
					stored[b.Key] = b.Data
				}
			}
			if after := betaEvicted(); after != before {
				rt.Fatalf("the victim's put evicted %d of its own blocks", after-before)
			}
		},
		"victim get": func(rt *rapid.T) {
			got, err := beta.GetBlocks(ctx, betaKeys, client.GetOptions{})
			if err != nil {
				rt.Fatal(err)
			}
			for i, k := range betaKeys {
				want, ok := stored[k]
				switch {
				case ok && got.Results[i] != kvtierv1.LookupResult_LOOKUP_RESULT_HIT:
					rt.Fatalf("the victim lost block %d", i)
				case ok && !bytes.Equal(got.Data[i], want):
					rt.Fatalf("the victim read wrong bytes for block %d", i)
				}
			}
		},
		"": func(rt *rapid.T) {
			if n := betaEvicted(); n != 0 {
				rt.Fatalf("%d of the victim's blocks evicted", n)
			}
		},
	})
}
