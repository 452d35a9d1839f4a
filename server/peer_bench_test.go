package server_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/kvtier/kvtier/blockstream"
	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/cpu"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiers/peer"
	rt "github.com/kvtier/kvtier/tiers/remote/remotetest"
)

// streamEnv makes the test binary, run as a child with it set, write
// that many bytes to the TCP address in KVTIER_STREAM_TO: the other end
// of the plain loopback stream between two processes.
const streamEnv = "KVTIER_STREAM_BYTES"

// clientEnv makes the test binary, run as a child with it set to put or
// get, do that many ops of perOp 2 MiB blocks over the block stream at
// KVTIER_STREAM_TO: a remote engine in its own process.
const clientEnv = "KVTIER_STREAM_CLIENT"

func init() {
	if mode := os.Getenv(clientEnv); mode != "" {
		os.Exit(streamClient(mode))
	}
	n, _ := strconv.Atoi(os.Getenv(streamEnv))
	if n <= 0 {
		return
	}
	c, err := net.Dial("tcp", os.Getenv("KVTIER_STREAM_TO"))
	if err != nil {
		os.Exit(2)
	}
	// KVTIER_STREAM_BUFS distinct 2 MiB buffers written in turn (as a
	// daemon sends distinct slots), or one 1 MiB buffer that stays in
	// cache.
	bufs := [][]byte{bytes.Repeat([]byte{7}, 1<<20)}
	if nb, _ := strconv.Atoi(os.Getenv("KVTIER_STREAM_BUFS")); nb > 0 {
		bufs = make([][]byte, nb)
		for i := range bufs {
			bufs[i] = bytes.Repeat([]byte{byte(i + 1)}, bigBlock)
		}
	}
	for i := 0; n > 0; i++ {
		buf := bufs[i%len(bufs)]
		m := min(n, len(buf))
		if _, err := c.Write(buf[:m]); err != nil {
			os.Exit(3)
		}
		n -= m
	}
	c.Close()
	os.Exit(0)
}

// streamClient is the child of the process benchmarks: ops × perOp
// PutBlocks of new blocks, or GetBlocks of blocks 0 … perOp-1 into its
// buffers, by value over TCP (so on the daemon's block stream), each
// checked.
func streamClient(mode string) int {
	ops, _ := strconv.Atoi(os.Getenv("KVTIER_STREAM_OPS"))
	perOp, _ := strconv.Atoi(os.Getenv("KVTIER_STREAM_PER_OP"))
	c, err := client.Dial(os.Getenv("KVTIER_STREAM_TO"), client.Options{})
	if err != nil {
		return 2
	}
	defer c.Close()
	ctx := context.Background()
	blocks := make([]client.Block, perOp)
	bufs := make([][]byte, perOp)
	keys := make([]offload.Key, perOp)
	for i := range blocks {
		blocks[i].Data = bytes.Repeat([]byte{byte(i + 1)}, bigBlock)
		bufs[i] = blocks[i].Data
		keys[i] = key(i)
	}
	for op := 1; op <= ops; op++ {
		if mode == "put" {
			for i := range blocks {
				blocks[i].Key = key(op*perOp + i)
			}
			stored, err := c.PutBlocks(ctx, blocks, client.CallOptions{})
			if err != nil || !stored[perOp-1] {
				return 3
			}
			continue
		}
		got, err := c.GetBlocks(ctx, keys, client.GetOptions{Buffers: bufs})
		if err != nil || got.Hits != perOp {
			return 4
		}
	}
	return 0
}

// benchClientProcess runs b.N ops of a remote engine in a child process
// (mode put or get) against a daemon with 2 MiB slots: as the plain
// stream's writer, its start is inside the timing.
func benchClientProcess(b *testing.B, mode string, perOp int) {
	var e *env
	if mode == "get" {
		e, _, _ = bigBlocksEnv(b, true, perOp)
	} else {
		e = startEnvSlot(b, envOptions{slots: 2 * perOp, tiers: noTiers, stream: true, arena: cpu.ArenaConfig{Kind: cpu.ArenaAnonymous}}, bigBlock)
	}
	cmd := benchChild()
	cmd.Env = append(os.Environ(), clientEnv+"="+mode, "KVTIER_STREAM_TO="+e.tcp,
		"KVTIER_STREAM_OPS="+strconv.Itoa(b.N), "KVTIER_STREAM_PER_OP="+strconv.Itoa(perOp))
	b.SetBytes(int64(perOp * bigBlock))
	b.ResetTimer()
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("client process: %v %s", err, out)
	}
}

// BenchmarkPeerTransfer2MiB moves 8 × 2 MiB per op from a daemon's
// primary into an arena through the peer tier — over the daemon's block
// stream (straight from the pinned slot into the socket and from the
// socket into the slot, checksummed) and over the API (GetBlocks by
// value), and a remote engine's PutBlocks and GetBlocks — against a plain
// TCP stream of the same bytes from another process in the same run, of
// the same 8 distinct blocks and of one cache-hot buffer. MB/s counts
// payload. Run it in rounds (BENCHMARKS.md) to compare paths seconds apart:
//
//	go test ./server/ -run '^$' -bench PeerTransfer2MiB -benchtime 20x
func BenchmarkPeerTransfer2MiB(b *testing.B) {
	const perOp = 8
	for _, path := range []string{"peer-stream", "peer-api"} {
		b.Run(path, func(b *testing.B) { benchPeerLoads(b, path == "peer-stream", perOp) })
	}
	// A remote engine's by-value reads: GetBlocks into its own buffers,
	// on the block stream and (NoStream) over the API.
	for _, path := range []string{"client-stream", "client-api"} {
		b.Run(path, func(b *testing.B) { benchClientGets(b, path == "client-stream", perOp) })
	}
	// Its by-value writes: PutBlocks on the block stream and over the API.
	for _, path := range []string{"client-put-stream", "client-put-api"} {
		b.Run(path, func(b *testing.B) { benchClientPuts(b, path == "client-put-stream", perOp) })
	}
	// The same engine in its own process, as the plain stream's writer is.
	for _, mode := range []string{"get", "put"} {
		b.Run("process-"+mode+"-stream", func(b *testing.B) { benchClientProcess(b, mode, perOp) })
	}
	for _, path := range []string{"tcp-stream", "tcp-blocks-stream"} {
		b.Run(path, func(b *testing.B) { benchPlainStream(b, path == "tcp-blocks-stream", perOp) })
	}
}

// benchPlainStream is the baseline: a plain loopback TCP stream of the
// same bytes from a child process. With blocks set both ends cycle over
// perOp distinct 2 MiB buffers, as the tier's sender and receiver touch
// perOp distinct slots; without, the writer repeats one 1 MiB buffer and
// the reader one 2 MiB buffer, which stay in cache.
func benchPlainStream(b *testing.B, blocks bool, perOp int) {
	{
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		total := b.N * perOp * bigBlock
		cmd := benchChild()
		cmd.Env = append(os.Environ(), streamEnv+"="+strconv.Itoa(total), "KVTIER_STREAM_TO="+l.Addr().String())
		dsts := [][]byte{make([]byte, bigBlock)}
		if blocks {
			cmd.Env = append(cmd.Env, "KVTIER_STREAM_BUFS="+strconv.Itoa(perOp))
			for len(dsts) < perOp {
				dsts = append(dsts, make([]byte, bigBlock))
			}
		}
		b.SetBytes(int64(perOp * bigBlock))
		b.ResetTimer()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		conn, err := l.Accept()
		if err != nil {
			b.Fatal(err)
		}
		var n int
		for i := 0; n < total; i++ {
			dst := dsts[i%len(dsts)]
			m, err := io.ReadFull(conn, dst[:min(len(dst), total-n)])
			n += m
			if err != nil {
				b.Fatalf("read %d of %d: %v", n, total, err)
			}
		}
		b.StopTimer()
		conn.Close()
		if err := cmd.Wait(); err != nil {
			b.Fatal(err)
		}
	}
}

// bigBlocksEnv is a daemon with 2 MiB slots (and a block stream when
// stream is set) holding perOp distinct blocks.
func bigBlocksEnv(b *testing.B, stream bool, perOp int) (*env, []offload.Key, []client.Block) {
	// The default arena, as in production.
	e := startEnvSlot(b, envOptions{slots: 16, tiers: noTiers, stream: stream, arena: cpu.ArenaConfig{Kind: cpu.ArenaAnonymous}}, bigBlock)
	keys := make([]offload.Key, perOp)
	blocks := make([]client.Block, perOp)
	for i := range keys {
		keys[i] = key(i)
		blocks[i] = client.Block{Key: keys[i], Data: bytes.Repeat([]byte{byte(i + 1)}, bigBlock)}
	}
	if _, err := e.dial(b, e.unix).PutBlocks(ctxT(b), blocks, client.CallOptions{}); err != nil {
		b.Fatal(err)
	}
	return e, keys, blocks
}

func benchPeerLoads(b *testing.B, stream bool, perOp int) {
	e, keys, blocks := bigBlocksEnv(b, stream, perOp)
	tier, err := peer.New(peer.Config{Name: "bench", Peers: []peer.PeerConfig{{Name: "a", Addr: e.tcp}}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer tier.Close(context.Background())
	req, _ := offload.NewReqContext("bench", nil)
	for _, k := range keys {
		if r := rt.Resolve(b, tier, k, req); r != offload.Hit {
			b.Fatalf("lookup %v", r)
		}
	}
	arena := rt.NewArena(bigBlock, perOp)
	b.SetBytes(int64(perOp * bigBlock))
	b.ResetTimer()
	id := uint64(0)
	for b.Loop() {
		id++
		if res := rt.Run(b, tier, rt.LoadJob(id, arena, keys, rt.Slots(0, perOp), req)); !res.Success {
			b.Fatal(res.Err)
		}
	}
	b.StopTimer()
	for i := range keys {
		got, _ := arena.Slot(int64(i))
		if !bytes.Equal(got, blocks[i].Data) {
			b.Fatalf("block %d differs", i)
		}
	}
}

// byValueClient dials e's daemon over TCP: its by-value calls take the
// block stream when stream is set, the API otherwise.
func byValueClient(b *testing.B, e *env, stream bool) *client.Client {
	c, err := client.Dial(e.tcp, client.Options{NoStream: !stream})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

// benchClientGets: a remote engine's GetBlocks into its own buffers.
func benchClientGets(b *testing.B, stream bool, perOp int) {
	e, keys, _ := bigBlocksEnv(b, true, perOp)
	ctx := ctxT(b)
	c := byValueClient(b, e, stream)
	bufs := make([][]byte, perOp)
	for i := range bufs {
		bufs[i] = make([]byte, bigBlock)
	}
	b.SetBytes(int64(perOp * bigBlock))
	b.ResetTimer()
	for b.Loop() {
		got, err := c.GetBlocks(ctx, keys, client.GetOptions{Buffers: bufs})
		if err != nil || got.Hits != perOp {
			b.Fatalf("hits %d err %v", got.Hits, err)
		}
	}
}

// benchClientPuts stores perOp new 2 MiB blocks per op (the primary
// evicts the previous op's) with PutBlocks.
func benchClientPuts(b *testing.B, stream bool, perOp int) {
	e := startEnvSlot(b, envOptions{slots: 2 * perOp, tiers: noTiers, stream: true, arena: cpu.ArenaConfig{Kind: cpu.ArenaAnonymous}}, bigBlock)
	ctx := ctxT(b)
	c := byValueClient(b, e, stream)
	blocks := make([]client.Block, perOp)
	for i := range blocks {
		blocks[i].Data = bytes.Repeat([]byte{byte(i + 1)}, bigBlock)
	}
	b.SetBytes(int64(perOp * bigBlock))
	b.ResetTimer()
	op := 0
	for b.Loop() {
		op++
		for i := range blocks {
			blocks[i].Key = key(op*perOp + i)
		}
		stored, err := c.PutBlocks(ctx, blocks, client.CallOptions{})
		if err != nil || !stored[perOp-1] {
			b.Fatalf("stored %v err %v", stored, err)
		}
	}
}

// BenchmarkPeerLookup1000Warm is what the peer tier adds to a step's
// lookup of a 1 000-key prefix that a peer holds: one Lookup call per
// key, answered from the peer's event index (indexed), or from the
// verdicts of the existence call once they are in (asked: the second
// step of a request, or a peer without events).
func BenchmarkPeerLookup1000Warm(b *testing.B) {
	const n = 1000
	for _, mode := range []string{"indexed", "asked"} {
		b.Run(mode, func(b *testing.B) {
			e := startEnv(b, envOptions{slots: 1024, tiers: noTiers, publish: mode == "indexed"})
			keys := putPrefix(b, e.dial(b, e.unix), n)
			index := mode == "indexed"
			tier, err := peer.New(peer.Config{Name: "bench", Peers: []peer.PeerConfig{{Name: "a", Addr: e.tcp}}, EventIndex: &index, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			defer tier.Close(context.Background())
			if index {
				rt.Eventually(b, 30*time.Second, "the index", func() bool { st := tier.Peers()[0]; return st.Indexed && st.IndexKeys == n })
			}
			req, _ := offload.NewReqContext("bench", nil)
			for _, k := range keys {
				tier.Lookup(k, req)
			}
			tier.OnScheduleEnd(offload.ScheduleEnd{})
			for _, k := range keys {
				if r := rt.Resolve(b, tier, k, req); r != offload.Hit {
					b.Fatalf("lookup %v", r)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				for _, k := range keys {
					if tier.Lookup(k, req) != offload.Hit {
						b.Fatal("miss")
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1000, "µs/prefix")
		})
	}
}

// pairedEnv, set, makes the test binary, run as a child, the other
// process of BenchmarkStreamPaired2MiB: connected to KVTIER_STREAM_TO, it
// reads a command byte and answers it, until the connection closes:
//
//	'P' the plain stream towards the daemon: writes its
//	    KVTIER_STREAM_PER_OP distinct 2 MiB buffers, in turn;
//	'Q' the plain stream from the daemon: reads n 2 MiB blocks into its n
//	    buffers, then writes one byte;
//	'A' the same into its arena's n slots;
//	'W' the block stream's wire format without a daemon: reads n blocks
//	    framed as a get's reply frames them into its n buffers, through a
//	    buffered reader and verifying each, as client.Stream does, then
//	    writes one byte;
//	'G' a remote engine's GetBlocks of blocks 0 … n-1 from the daemon at
//	    KVTIER_STREAM_GET, into its n buffers, then writes one byte;
//	'U' its PutBlocks of n new blocks to the daemon at KVTIER_STREAM_PUT;
//	'R' a peer tier's load of blocks 0 … n-1 from the daemon at
//	    KVTIER_STREAM_GET into its arena's n slots.
//
// After the last command it checks what it read and exits 4 on a
// difference.
const pairedEnv = "KVTIER_STREAM_PAIRED"

func init() {
	if os.Getenv(pairedEnv) != "" {
		os.Exit(pairedChild())
	}
}

func pairedChild() int {
	c, err := net.Dial("tcp", os.Getenv("KVTIER_STREAM_TO"))
	if err != nil {
		return 2
	}
	perOp, _ := strconv.Atoi(os.Getenv("KVTIER_STREAM_PER_OP"))
	ctx := context.Background()
	getter, err := client.Dial(os.Getenv("KVTIER_STREAM_GET"), client.Options{})
	if err != nil {
		return 2
	}
	putter, err := client.Dial(os.Getenv("KVTIER_STREAM_PUT"), client.Options{})
	if err != nil {
		return 2
	}
	tier, err := peer.New(peer.Config{Name: "bench", Peers: []peer.PeerConfig{{Name: "a", Addr: os.Getenv("KVTIER_STREAM_GET")}}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return 2
	}
	defer tier.Close(ctx)
	req, _ := offload.NewReqContext("bench", nil)
	keys := make([]offload.Key, perOp)
	bufs, puts, want := make([][]byte, perOp), make([]client.Block, perOp), make([][]byte, perOp)
	for i := range keys {
		keys[i] = key(i)
		bufs[i] = make([]byte, bigBlock)
		want[i] = bytes.Repeat([]byte{byte(i + 1)}, bigBlock)
		puts[i].Data = want[i]
	}
	for _, k := range keys {
		for tier.Lookup(k, req) == offload.Retry {
			tier.OnScheduleEnd(offload.ScheduleEnd{})
			time.Sleep(time.Millisecond)
		}
	}
	arena := rt.NewArena(bigBlock, perOp)
	var one [1]byte
	id, op := uint64(0), 0
	for { // the benchmark's warm-up sends every command first
		if _, err := io.ReadFull(c, one[:]); err != nil {
			break
		}
		switch one[0] {
		case 'P':
			for _, b := range want {
				if _, err := c.Write(b); err != nil {
					return 3
				}
			}
			continue
		case 'Q':
			for _, b := range bufs {
				if _, err := io.ReadFull(c, b); err != nil {
					return 3
				}
			}
		case 'A':
			for i := range perOp {
				b, _ := arena.Slot(int64(i))
				if _, err := io.ReadFull(c, b); err != nil {
					return 3
				}
			}
		case 'W':
			r := bufio.NewReaderSize(c, 64<<10) // as the client's stream
			var h blockstream.Summer
			for _, b := range bufs {
				if _, err := r.ReadByte(); err != nil {
					return 3
				}
				if n, err := blockstream.ReadLen(r, &h); err != nil || n != int64(len(b)) {
					return 3
				}
				if whole, err := blockstream.ReadBody(r, b, &h); err != nil || !whole {
					return 3
				}
			}
		case 'G':
			got, err := getter.GetBlocks(ctx, keys, client.GetOptions{Buffers: bufs})
			if err != nil || got.Hits != perOp {
				return 3
			}
		case 'U':
			op++
			for i := range puts {
				puts[i].Key = key(op*perOp + i)
			}
			stored, err := putter.PutBlocks(ctx, puts, client.CallOptions{})
			if err != nil || !stored[perOp-1] {
				return 3
			}
		case 'R':
			id++
			tier.SubmitLoad(rt.LoadJob(id, arena, keys, rt.Slots(0, perOp), req))
			var res []offload.JobResult
			for len(res) == 0 {
				_ = tier.DrainJobs(ctx)
				res = tier.FinishedJobs()
			}
			if !res[0].Success {
				return 3
			}
		}
		if _, err := c.Write(one[:]); err != nil {
			return 3
		}
	}
	for i := range keys {
		slot, _ := arena.Slot(int64(i))
		if !bytes.Equal(slot, want[i]) || !bytes.Equal(bufs[i], want[i]) {
			return 4
		}
	}
	return 0
}

// daemonSlots returns the slots of e's primary that hold blocks, in
// their order: the memory the daemon sends them from.
func daemonSlots(b *testing.B, e *env, blocks []client.Block) [][]byte {
	a := e.prim.Arena()
	out := make([][]byte, len(blocks))
	for i, blk := range blocks {
		for s := range int64(a.NumSlots()) {
			if d, _ := a.Slot(s); bytes.Equal(d, blk.Data) {
				out[i] = d
			}
		}
		if out[i] == nil {
			b.Fatalf("block %d is in no slot of the daemon's primary", i)
		}
	}
	return out
}

// benchChild is the test binary as the other process of a benchmark.
// For investigation, KVTIER_CHILD_CPU pins it to a CPU (taskset): with
// this process under taskset on another, the two ends never share one,
// which steadies the rates — but each Go process then runs with
// GOMAXPROCS 1, which is not how a daemon runs (BENCHMARKS.md).
func benchChild() *exec.Cmd {
	if cpu := os.Getenv("KVTIER_CHILD_CPU"); cpu != "" {
		return exec.Command("taskset", "-c", cpu, os.Args[0], "-test.run=^$")
	}
	return exec.Command(os.Args[0], "-test.run=^$")
}

// BenchmarkStreamPaired2MiB measures the block stream against a plain
// loopback TCP stream between two processes, op by op, so that both see
// the same seconds of this machine, and each path against a plain stream
// that moves the same bytes in the same direction between the same
// buffers: a path compared with another direction measures the direction
// (here the two differ by up to a third from minute to minute), and one
// compared with other memory measures which memory the caches still hold
// (a plain stream between the buffers it used a moment before ran up to a
// sixth faster than one from the daemon's slots). The other process (the
// test binary as a child) is a remote engine and a peer. Per op, each
// path between two plain ops of its own:
//
//   - peer: its peer tier's load of 8 blocks from this process's daemon
//     into 8 arena slots; plain: this process writes the 8 daemon slots
//     that hold them, the child reads them into the same 8 arena slots;
//   - get: its GetBlocks of the 8 blocks into its 8 buffers; plain: the
//     8 daemon slots into those 8 buffers;
//   - wire: this process writes 8 buffers of its own framed and summed as
//     the daemon's get reply (blockstream.WriteBlockSummed), the child
//     reads and verifies them as client.Stream does into its 8 buffers:
//     the format and the receiver's verification alone, without a
//     daemon; plain: the same buffers unframed;
//   - put: its PutBlocks of 8 new blocks from its 8 buffers to another
//     daemon here (whose primary evicts the previous op's blocks); plain:
//     the child writes its 8 buffers, read here into 8 of this process.
//
// Every path touches 8 distinct 2 MiB buffers at each end, as its plain
// op does, and each op is timed here from the command byte to the last
// byte of the answer. Reported: each path's payload rate and its ratio to
// the mean of the plain ops just before and after it (1: the socket's
// speed). Rounds are -count runs:
//
//	go test -c -o /tmp/server.test ./server/
//	/tmp/server.test -test.run '^$' -test.bench StreamPaired2MiB -test.benchtime 100x -test.count 8
//
// For investigation, KVTIER_CHILD_CPU pins the child (benchChild).
func BenchmarkStreamPaired2MiB(b *testing.B) {
	const perOp = 8
	e, _, blocks := bigBlocksEnv(b, true, perOp)
	srcs := make([][]byte, perOp) // what this process writes itself
	sums := make([]uint64, perOp)
	for i := range srcs {
		srcs[i] = bytes.Clone(blocks[i].Data)
		sums[i] = blockstream.Sum(srcs[i])
	}
	slots := daemonSlots(b, e, blocks) // what the daemon sends a get from
	pe := startEnvSlot(b, envOptions{slots: 2 * perOp, tiers: noTiers, stream: true, arena: cpu.ArenaConfig{Kind: cpu.ArenaAnonymous}}, bigBlock)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	cmd := benchChild()
	cmd.Env = append(os.Environ(), pairedEnv+"=1", "KVTIER_STREAM_TO="+l.Addr().String(), "KVTIER_STREAM_PER_OP="+strconv.Itoa(perOp),
		"KVTIER_STREAM_GET="+e.tcp, "KVTIER_STREAM_PUT="+pe.tcp)
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	c, err := l.Accept()
	if err != nil {
		b.Fatal(err)
	}
	dsts := make([][]byte, perOp)
	for i := range dsts {
		dsts[i] = make([]byte, bigBlock)
	}
	var one [1]byte
	child := map[byte]byte{'S': 'Q', 'T': 'A'} // what the child does for these
	do := func(what byte) time.Duration {
		t0 := time.Now()
		cmd := what
		if c, ok := child[what]; ok {
			cmd = c
		}
		if _, err := c.Write([]byte{cmd}); err != nil {
			b.Fatal(err)
		}
		switch what {
		case 'P':
			for _, d := range dsts {
				if _, err := io.ReadFull(c, d); err != nil {
					b.Fatal(err)
				}
			}
			return time.Since(t0)
		case 'Q':
			for _, s := range srcs {
				if _, err := c.Write(s); err != nil {
					b.Fatal(err)
				}
			}
		case 'S', 'T': // from the daemon's slots, into the child's buffers or arena
			for _, s := range slots {
				if _, err := c.Write(s); err != nil {
					b.Fatal(err)
				}
			}
		case 'W':
			w := bufio.NewWriterSize(c, 64<<10) // as the daemon's stream
			for i, s := range srcs {
				if err := blockstream.WriteBlockSummed(w, c, s, sums[i]); err != nil {
					b.Fatal(err)
				}
			}
		}
		if _, err := io.ReadFull(c, one[:]); err != nil {
			b.Fatalf("%c: %v (child: %s)", what, err, out)
		}
		return time.Since(t0)
	}
	paths := []byte{'R', 'G', 'W', 'U'}
	// Each path's plain op moves the same bytes between the same buffers
	// at both ends as the path does (the direction, and which memory the
	// caches hold, weigh on both alike).
	plains := []byte{'T', 'S', 'Q', 'P'}
	names := []string{"peer", "get", "wire", "put"}
	var plainT, pathT [4]time.Duration
	var pairs [4][]float64 // per op: plain time / path time
	for _, p := range append([]byte{'P', 'Q', 'S', 'T'}, paths...) {
		do(p) // warm every connection
	}
	b.ResetTimer()
	for range b.N {
		for i, p := range paths {
			// A plain op on each side: drift, and what the op before
			// left in the caches, weigh on both alike.
			pt := do(plains[i])
			t := do(p)
			pt = (pt + do(plains[i])) / 2
			plainT[i] += pt
			pathT[i] += t
			pairs[i] = append(pairs[i], float64(pt)/float64(t))
		}
	}
	b.StopTimer()
	c.Close()
	if err := cmd.Wait(); err != nil {
		b.Fatalf("child: %v %s", err, out)
	}
	for i := range dsts {
		if !bytes.Equal(dsts[i], blocks[i].Data) {
			b.Fatalf("plain buffer %d differs", i)
		}
	}
	mbps := func(d time.Duration) float64 { return float64(b.N*perOp*bigBlock) / d.Seconds() / 1e6 }
	for i, name := range names {
		b.ReportMetric(mbps(pathT[i]), name+"-MB/s")
		b.ReportMetric(float64(plainT[i])/float64(pathT[i]), name+"/plain")
		// The median pair: robust to the odd op that this machine stalls.
		slices.Sort(pairs[i])
		b.ReportMetric(pairs[i][len(pairs[i])/2], name+"/plain-med")
	}
	b.ReportMetric(mbps(plainT[0]+plainT[1]+plainT[2])*3, "plain-from-MB/s")
	b.ReportMetric(mbps(plainT[3]), "plain-to-MB/s")
}
