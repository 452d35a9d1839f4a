package server_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/offload"
)

// The soak test runs a race-built daemon with a shared (memfd) arena and an
// fs tier under 32 client processes that store, load and verify blocks
// through the arena, while the test kills clients at random (SIGKILL, in
// the middle of whatever they were doing), restarts them and Resets the
// daemon. It then ends every client and requires that the daemon's
// goroutines, descriptors and resident memory return to the baseline
// (see below), that nothing is left held, and that
// no client ever read a byte other than its key's content.
//
// KVTIER_SOAK_DURATION sets how long the clients run (default 15s: this
// runs in the suite; BENCHMARKS.md records a longer run).

const soakClientEnv = "KVTIER_TEST_SOAK_CLIENT"

func init() {
	if target := os.Getenv(soakClientEnv); target != "" {
		seed, _ := strconv.ParseUint(os.Getenv(soakClientEnv+"_SEED"), 10, 64)
		os.Exit(soakClient(target, seed))
	}
}

// soakUniverse is the key space the clients share: small enough that
// they store, evict, reload and promote the same keys all the time.
const soakUniverse = 400

// soakClient is one client process: it loops over random requests until
// killed or until its stdin closes, printing "ok N" every 50 verified
// reads and "WRONG ..." on a read whose bytes are not its key's.
func soakClient(target string, seed uint64) int {
	ctx := context.Background()
	c, err := client.Dial(target, client.Options{})
	if err != nil {
		fmt.Println("dial:", err)
		return 2
	}
	a, err := c.MapArena(ctx)
	if err != nil {
		fmt.Println("map arena:", err)
		return 2
	}
	stop := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(stop) }()
	rng := rand.New(rand.NewPCG(seed, 7))
	verified := 0
	for n := 0; ; n++ {
		select {
		case <-stop:
			fmt.Println("done", verified)
			return 0
		default:
		}
		id := fmt.Sprint("r", n)
		if _, err := c.NewRequest(ctx, id, ""); err != nil {
			continue // a Reset or a full daemon: try the next one
		}
		from := rng.IntN(soakUniverse - 8)
		ks := keys(from, 1+rng.IntN(8))
		// Load what is there, verify it through the arena.
		res, _, err := c.Lookup(ctx, id, ks, true)
		if err == nil {
			hit := 0
			for hit < len(res) && res[hit] == kvtierv1.LookupResult_LOOKUP_RESULT_HIT {
				hit++
			}
			if hit > 0 {
				// Other clients' stores may have evicted some since the
				// lookup: those are misses (slot -1).
				if slots, _, err := c.PrepareLoadPresent(ctx, id, ks[:hit]); err == nil {
					var pinned []offload.Key
					for i, s := range slots {
						if s < 0 {
							continue
						}
						pinned = append(pinned, ks[i])
						b, err := a.Slot(s)
						if err != nil {
							fmt.Println("slot:", err)
							return 2
						}
						if !bytes.Equal(b, blockOf(ks[i])) {
							fmt.Printf("WRONG %v in slot %d\n", ks[i], s)
						}
						verified++
						if verified%50 == 0 {
							fmt.Println("ok", verified)
						}
					}
					if rng.IntN(200) > 0 && len(pinned) > 0 { // rarely forget: the session owns it
						c.CompleteLoad(ctx, id, pinned)
					}
				}
			}
		}
		// Store what is not.
		rsv, err := c.PrepareStore(ctx, id, ks, nil)
		if err == nil && rsv.OK && len(rsv.Keys) > 0 {
			for i, k := range rsv.Keys {
				b, err := a.Slot(rsv.Slots[i])
				if err != nil {
					fmt.Println("slot:", err)
					return 2
				}
				copy(b, blockOf(k))
			}
			switch rng.IntN(200) {
			case 0: // forget: the session owns the reservation
			case 1, 2, 3, 4, 5, 6, 7, 8, 9, 10:
				c.CompleteStore(ctx, id, rsv.Keys, false)
			default:
				c.CompleteStore(ctx, id, rsv.Keys, true)
			}
		}
		if rng.IntN(200) > 0 {
			c.FinishRequest(ctx, id)
		}
		c.ScheduleEnd(ctx, []string{id}, nil)
	}
}

var metricRE = regexp.MustCompile(`(?m)^(go_memstats_heap_inuse_bytes|go_goroutines|process_open_fds|process_resident_memory_bytes|kvtier_connections|kvtier_active_requests\{[^}]*\}|kvtier_primary_slots\{[^}]*state="(?:pinned|pending)"\}) (\S+)$`)

// soakMetrics scrapes the daemon's /metrics for the figures the soak
// test watches.
func soakMetrics(t *testing.T, url string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, m := range metricRE.FindAllStringSubmatch(scrapeURL(t, url), -1) {
		name := m[1]
		if i := strings.IndexByte(name, '{'); i >= 0 {
			if strings.Contains(name, "pinned") {
				name = "pinned"
			} else if strings.Contains(name, "pending") {
				name = "pending"
			} else {
				name = name[:i]
			}
		}
		v, _ := strconv.ParseFloat(m[2], 64)
		out[name] = v
	}
	return out
}

func TestSoakKillsAndResets(t *testing.T) {
	if testing.Short() {
		t.Skip("a soak of a race-built daemon and 32 client processes")
	}
	if !raceEnabled {
		t.Skip("the soak runs the daemon under the race detector; run with -race")
	}
	dur := 15 * time.Second
	if s := os.Getenv("KVTIER_SOAK_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("KVTIER_SOAK_DURATION: %v", err)
		}
		dur = d
	}
	const clients = 32
	dir := shortTempDir(t)
	metricsAddr := freeAddr(t)
	cfg := daemonConfig(t, dir, "")
	raw, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// 256 slots: room for the clients to fill and evict, few enough that
	// slots are reused all the time.
	raw = bytes.Replace(raw, []byte(fmt.Sprintf("bytes: %d", 64*daemonBlock)), []byte(fmt.Sprintf("bytes: %d", 256*daemonBlock)), 1)
	raw = bytes.Replace(raw, []byte(`metrics_addr: ""`), []byte("metrics_addr: "+metricsAddr), 1)
	if err := os.WriteFile(cfg, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	d := &daemon{cmd: exec.Command(kvtierRaceBinary(t), "serve", "--config", cfg), done: make(chan error, 1)}
	startDaemonCmd(t, d, cfg)
	url := "http://" + metricsAddr + "/metrics"
	ctl, err := client.Dial(d.unix, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	// The idle baseline for goroutines and descriptors: they must come
	// back exactly. Resident memory cannot (the Go runtime and the race
	// detector keep what they grew to), so its baseline is taken after a
	// warm-up at the soak's own load: what a second run adds is a leak.
	waitSettled(t, ctl, url, 1)
	idle := soakMetrics(t, url)
	runSoakClients(t, d.unix, clients, dur/3, 200*time.Millisecond, nil, nil)
	waitSettled(t, ctl, url, 1)
	base := soakMetrics(t, url)

	var wrong atomic.Int64
	var wrongLines []string
	var mu sync.Mutex
	onLine := func(line string) {
		if strings.HasPrefix(line, "WRONG") {
			wrong.Add(1)
			mu.Lock()
			wrongLines = append(wrongLines, line)
			mu.Unlock()
		}
	}
	resets := 0
	peak := 0.0
	stats := runSoakClients(t, d.unix, clients, dur, 200*time.Millisecond, func(kills int) {
		if kills%5 == 0 {
			if err := ctl.Reset(ctxT(t)); err != nil {
				t.Errorf("reset: %v", err)
			}
			resets++
		}
		if kills%10 == 0 {
			peak = max(peak, soakMetrics(t, url)["process_resident_memory_bytes"])
		}
	}, onLine)
	waitSettled(t, ctl, url, 1)
	end := soakMetrics(t, url)
	st, err := ctl.Stats(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("soak %v: %d clients, %d killed, %d Resets, %d verified reads, %d wrong; released %d requests of ended sessions",
		dur, clients, stats.killed, resets, stats.verified.Load(), wrong.Load(), st.GetReleasedRequests())
	t.Logf("Go heap in use: %.1f MiB idle, %.1f MiB after the warm-up, %.1f MiB after the soak",
		idle["go_memstats_heap_inuse_bytes"]/(1<<20), base["go_memstats_heap_inuse_bytes"]/(1<<20), end["go_memstats_heap_inuse_bytes"]/(1<<20))
	t.Logf("idle: %.0f goroutines, %.0f fds, %.1f MiB RSS; after a warm-up of %v: %.0f goroutines, %.0f fds, %.1f MiB RSS; peak during the soak %.1f MiB RSS; after it: %.0f goroutines, %.0f fds, %.1f MiB RSS",
		idle["go_goroutines"], idle["process_open_fds"], idle["process_resident_memory_bytes"]/(1<<20), dur/3,
		base["go_goroutines"], base["process_open_fds"], base["process_resident_memory_bytes"]/(1<<20),
		peak/(1<<20), end["go_goroutines"], end["process_open_fds"], end["process_resident_memory_bytes"]/(1<<20))
	if wrong.Load() > 0 {
		t.Fatalf("%d reads returned another block's bytes: %v", wrong.Load(), wrongLines)
	}
	if stats.verified.Load() == 0 {
		t.Fatal("no client verified a read: the soak exercised nothing")
	}
	// Goroutines and descriptors come back exactly (a few goroutines of
	// gRPC's idle machinery may linger); memory within what the runtime
	// keeps for reuse.
	if g, g0 := end["go_goroutines"], idle["go_goroutines"]; g > g0+4 {
		t.Errorf("goroutines: %.0f after, %.0f idle before: a leak", g, g0)
	}
	if f, f0 := end["process_open_fds"], idle["process_open_fds"]; f > f0 {
		t.Errorf("descriptors: %.0f after, %.0f idle before: a leak", f, f0)
	}
	// Memory: the Go heap in use (live data plus garbage no GC has
	// collected yet on an idle daemon) comes back to the warm-up's order;
	// RSS (the race detector's shadow memory, the runtime's free spans)
	// only has to stay within the warm-up's. Both are loose: they catch a
	// leak that grows with the run, not a few MiB.
	if h, h0 := end["go_memstats_heap_inuse_bytes"], max(base["go_memstats_heap_inuse_bytes"], idle["go_memstats_heap_inuse_bytes"]); h > 2*h0+32<<20 {
		t.Errorf("Go heap in use %.1f MiB after the soak, %.1f MiB before: a leak", h/(1<<20), h0/(1<<20))
	}
	if r, r0 := end["process_resident_memory_bytes"], base["process_resident_memory_bytes"]; r > 2*r0+64<<20 {
		t.Errorf("RSS %.1f MiB after the soak, %.1f MiB after the warm-up: a leak", r/(1<<20), r0/(1<<20))
	}
	d.stop(t)
	if os.Getenv("KVTIER_SOAK_LOG") != "" {
		t.Log(d.log())
	}
	if strings.Contains(d.log(), "DATA RACE") {
		t.Fatalf("the daemon reported a data race:\n%s", d.log())
	}
}

type soakStats struct {
	killed   int
	verified atomic.Int64
}

// runSoakClients runs n client processes for dur, killing one every
// killEvery (and starting a new one in its place) and calling afterKill
// with the number of kills so far; then it ends them all and waits for
// them. onLine sees every client output line that is not a progress line.
func runSoakClients(t *testing.T, target string, n int, dur, killEvery time.Duration, afterKill func(kills int), onLine func(string)) *soakStats {
	t.Helper()
	st := &soakStats{}
	type proc struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		done  chan struct{}
	}
	var wg sync.WaitGroup
	seed := uint64(0)
	start := func() *proc {
		seed++
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), soakClientEnv+"="+target, fmt.Sprintf("%s_SEED=%d", soakClientEnv, seed))
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		p := &proc{cmd: cmd, stdin: stdin, done: make(chan struct{})}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(p.done)
			sc := bufio.NewScanner(out)
			last := int64(0)
			for sc.Scan() {
				line := sc.Text()
				var v int64
				if _, err := fmt.Sscanf(line, "ok %d", &v); err == nil {
					st.verified.Add(v - last)
					last = v
				} else if _, err := fmt.Sscanf(line, "done %d", &v); err == nil {
					st.verified.Add(v - last)
					last = v
				} else if onLine != nil {
					onLine(line)
				}
				if strings.HasPrefix(line, "dial:") || strings.HasPrefix(line, "map arena:") || strings.HasPrefix(line, "slot:") {
					t.Errorf("soak client: %s", line)
				}
			}
			cmd.Wait()
		}()
		return p
	}
	procs := make([]*proc, n)
	for i := range procs {
		procs[i] = start()
	}
	rng := rand.New(rand.NewPCG(1, 2))
	deadline := time.Now().Add(dur)
	for time.Now().Before(deadline) && killEvery > 0 {
		time.Sleep(killEvery)
		i := rng.IntN(n)
		procs[i].cmd.Process.Kill()
		<-procs[i].done
		st.killed++
		procs[i] = start()
		if afterKill != nil {
			afterKill(st.killed)
		}
	}
	if killEvery == 0 {
		// A warm-up: run until the clients have verified some reads.
		for wait := time.Now().Add(30 * time.Second); st.verified.Load() < 50 && time.Now().Before(wait); {
			time.Sleep(10 * time.Millisecond)
		}
	}
	for _, p := range procs {
		p.stdin.Close() // ask it to stop between requests
	}
	wg.Wait()
	return st
}

// waitSettled waits until the daemon holds nothing: conns client
// connections (the test's own), no active request, no pinned or pending
// slot that a client or a tier job holds.
func waitSettled(t *testing.T, ctl *client.Client, url string, conns float64) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		// A step ends the tiers' jobs in flight (their pins go away).
		ctl.ScheduleEnd(ctxT(t), nil, nil)
		m := soakMetrics(t, url)
		if m["kvtier_connections"] == conns && m["kvtier_active_requests"] == 0 && m["pinned"] == 0 && m["pending"] == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon never settled: %v", m)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

var (
	raceBuildOnce sync.Once
	raceBinPath   string
	raceBuildErr  error
)

// kvtierRaceBinary builds ./cmd/kvtier with the race detector once.
func kvtierRaceBinary(t *testing.T) string {
	t.Helper()
	raceBuildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kvtier-race-bin")
		if err != nil {
			raceBuildErr = err
			return
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		raceBinPath = filepath.Join(dir, "kvtier")
		_, file, _, _ := runtime.Caller(0)
		cmd := exec.Command("go", "build", "-race", "-o", raceBinPath, "./cmd/kvtier")
		cmd.Dir = filepath.Dir(filepath.Dir(file))
		if out, err := cmd.CombinedOutput(); err != nil {
			raceBuildErr = fmt.Errorf("go build -race ./cmd/kvtier: %v\n%s", err, out)
		}
	})
	if raceBuildErr != nil {
		t.Fatal(raceBuildErr)
	}
	return raceBinPath
}
