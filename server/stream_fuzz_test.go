package server_test

import (
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/kvtier/kvtier/blockstream"
	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/offload"
)

// FuzzBlockStream sends arbitrary requests after a valid hello: whatever
// arrives, the daemon never panics, leaves no slot pinned or reserved once
// the connection ends, stores nothing that is not whole, and still serves
// the next client.
func FuzzBlockStream(f *testing.F) {
	e := startEnv(f, envOptions{slots: 8, tiers: noTiers, stream: true})
	keyed := func(word uint32, ks ...offload.Key) []byte {
		b := binary.BigEndian.AppendUint32(nil, word)
		for _, k := range ks {
			b = binary.BigEndian.AppendUint16(b, uint16(len(k)))
			b = append(b, k...)
		}
		return b
	}
	withBlock := func(b []byte, k offload.Key, sum uint64) []byte {
		b = binary.BigEndian.AppendUint32(b, slotSize)
		b = append(b, block(k)...)
		return binary.BigEndian.AppendUint64(b, sum)
	}
	k := key(1)
	f.Add(keyed(1, k))
	f.Add(withBlock(keyed(1|blockstream.PutFlag, k), k, blockstream.Sum(block(k))))
	f.Add(withBlock(keyed(1|blockstream.PutFlag|blockstream.PushFlag, k), k, 1))
	f.Add(append(keyed(1|blockstream.ParamsFlag, k), 0, 2, '{', '}', 0, 0, 0, 9, 1))
	f.Add(withBlock(append(keyed(1|blockstream.PutFlag|blockstream.ParamsFlag, k), 0, 1, '['), k, 0))
	f.Add(keyed(2|blockstream.Flags, k, k))
	f.Add([]byte{0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, req []byte) {
		conn, r, hs := streamHello(t, e.srv.StreamAddr(), "", "")
		if hs != 0 {
			t.Fatalf("hello %d", hs)
		}
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := conn.Write(req); err != nil {
			t.Fatal(err)
		}
		_ = conn.(*net.TCPConn).CloseWrite()
		_, _ = io.Copy(io.Discard, r) // until the daemon ends the connection
		conn.Close()

		api := e.dial(t, e.unix)
		ctx := ctxT(t)
		for {
			st, err := api.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			p := st.GetPrimary()
			if p.GetPinnedSlots() == 0 && p.GetPendingSlots() == 0 {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("after the connection ended: %d slots pinned, %d reserved", p.GetPinnedSlots(), p.GetPendingSlots())
			case <-time.After(time.Millisecond):
			}
		}
		got, err := api.GetBlocks(ctx, []offload.Key{k}, client.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Data[0] != nil && string(got.Data[0]) != string(block(k)) {
			t.Fatal("the primary serves bytes that were never put whole")
		}
	})
}
