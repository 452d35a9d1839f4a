package server_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
)

func streamHello(t *testing.T, addr, token, ns string) (net.Conn, *bufio.Reader, byte) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	msg := []byte("KVBS\x01")
	for _, f := range []string{token, ns} {
		msg = binary.BigEndian.AppendUint16(msg, uint16(len(f)))
		msg = append(msg, f...)
	}
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	var reply [5]byte
	if _, err := io.ReadFull(r, reply[:]); err != nil {
		return c, r, 255
	}
	return c, r, reply[4]
}

// The block stream checks the token and the namespace, answers misses
// and hits with their checksum, refuses oversized requests, and does not
// hold Shutdown up with an idle connection.
func TestBlockStreamProtocol(t *testing.T) {
	e := startEnv(t, envOptions{slots: 8, tiers: noTiers, token: "tok", stream: true})
	addr := e.srv.StreamAddr()
	if addr == "" {
		t.Fatal("no stream address")
	}
	if _, _, st := streamHello(t, addr, "wrong", ""); st != 1 {
		t.Errorf("wrong token: status %d, want refused", st)
	}
	if _, _, st := streamHello(t, addr, "tok", "nope"); st != 1 {
		t.Errorf("unknown namespace: status %d, want refused", st)
	}
	c := e.dial(t, e.unix)
	k := key(1)
	data := make([]byte, slotSize)
	data[7] = 42
	if _, err := c.PutBlocks(ctxT(t), []client.Block{{Key: k, Data: data}}, client.CallOptions{}); err != nil {
		t.Fatal(err)
	}
	conn, r, st := streamHello(t, addr, "tok", "")
	if st != 0 {
		t.Fatalf("hello status %d", st)
	}
	req := binary.BigEndian.AppendUint32(nil, 2)
	for _, kk := range [][]byte{[]byte(k), []byte(key(2))} {
		req = binary.BigEndian.AppendUint16(req, uint16(len(kk)))
		req = append(req, kk...)
	}
	if _, err := conn.Write(req); err != nil {
		t.Fatal(err)
	}
	found, _ := r.ReadByte()
	var hdr [12]byte
	io.ReadFull(r, hdr[:])
	got := make([]byte, binary.BigEndian.Uint32(hdr[:4]))
	io.ReadFull(r, got)
	miss, err := r.ReadByte()
	if found != 1 || len(got) != slotSize || got[7] != 42 || miss != 0 || err != nil {
		t.Fatalf("answer: found %d len %d byte %d, then %d (%v)", found, len(got), got[7], miss, err)
	}
	// A request beyond the key limit ends the connection.
	if _, err := conn.Write(binary.BigEndian.AppendUint32(nil, 1<<30)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ReadByte(); err == nil {
		t.Fatal("connection still open after an oversized request")
	}
	// An idle stream connection does not hold Shutdown up.
	idle, _, _ := streamHello(t, addr, "tok", "")
	_ = idle
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := e.srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("shutdown took %v with an idle stream connection", d)
	}
}
