package s3

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/kvtier/kvtier/offload"
	rt "github.com/kvtier/kvtier/tiers/remote/remotetest"
)

// Throughput with 2 MiB blocks through the tier against the bare SDK
// client doing the same PUT/GET loop on the same server in the same run.
// The server is $KVTIER_TEST_S3_ENDPOINT when set, else a versitygw the
// benchmark starts. Stores use fresh keys (the tier skips existing
// objects), so run with a fixed count, e.g. -benchtime=40x.
//
//	go test -run '^$' -bench Throughput -benchtime=40x ./tiers/s3/

const benchBlock = 2 << 20

func benchConfig(b *testing.B) Config {
	b.Helper()
	var cfg Config
	if ep := os.Getenv("KVTIER_TEST_S3_ENDPOINT"); ep != "" {
		cfg = DefaultConfig()
		cfg.Endpoint = ep
		cfg.AccessKey, cfg.SecretKey = os.Getenv("KVTIER_TEST_S3_ACCESS_KEY"), os.Getenv("KVTIER_TEST_S3_SECRET_KEY")
	} else {
		v := startVersity(b)
		cfg = DefaultConfig()
		cfg.Endpoint = "http://" + v.addr
		cfg.AccessKey, cfg.SecretKey = v.ak, v.sk
	}
	cfg.Name = "bench"
	cfg.Bucket = rt.UniqueName()
	cfg.CreateBucket = true
	cfg.IOThreads = 8
	cfg.Logger = slog.New(slog.DiscardHandler)
	b.Cleanup(func() { removeBucket(cfg) })
	return cfg
}

// BenchmarkThroughput runs, per width (blocks per job, done concurrently),
// the tier and the bare client on the same server.
func BenchmarkThroughput(b *testing.B) {
	cfg := benchConfig(b)
	tier, err := New(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer tier.Close(context.Background())
	bare := newClient(cfg.withDefaults(), newHTTPClient(8))

	for _, width := range []int{1, 8} {
		arena := rt.NewArena(benchBlock, width)
		for i := 0; i < width; i++ {
			arena.Fill(int64(i), uint64(i))
		}
		next := 0
		fresh := func() []offload.Key { k := rt.Keys(next, width); next += width; return k }
		var loadKeys []offload.Key

		b.Run(name("tier", "put", width), func(b *testing.B) {
			b.SetBytes(int64(width * benchBlock))
			for i := 0; i < b.N; i++ {
				keys := fresh()
				if res := rt.Run(b, tier, rt.StoreJob(uint64(next), arena, keys, rt.Slots(0, width))); !res.Success {
					b.Fatal(res.Err)
				}
				loadKeys = keys
			}
		})
		b.Run(name("bare", "put", width), func(b *testing.B) {
			b.SetBytes(int64(width * benchBlock))
			for i := 0; i < b.N; i++ {
				keys := fresh()
				parallel(width, func(j int) {
					slot, _ := arena.Slot(int64(j))
					_, err := bare.PutObject(context.Background(), &s3.PutObjectInput{
						Bucket: aws.String(cfg.Bucket), Key: aws.String("bare/" + keys[j].HexHash()),
						Body: bytes.NewReader(slot), ContentLength: aws.Int64(int64(len(slot))),
					}, s3.WithAPIOptions(v4.SwapComputePayloadSHA256ForUnsignedPayloadMiddleware))
					if err != nil {
						b.Error(err)
					}
				})
			}
		})
		bareKeys := rt.Keys(next, width)
		parallel(width, func(j int) {
			slot, _ := arena.Slot(int64(j))
			bare.PutObject(context.Background(), &s3.PutObjectInput{Bucket: aws.String(cfg.Bucket), Key: aws.String("bare/" + bareKeys[j].HexHash()), Body: bytes.NewReader(slot)},
				s3.WithAPIOptions(v4.SwapComputePayloadSHA256ForUnsignedPayloadMiddleware))
		})
		dst := rt.NewArena(benchBlock, width)
		b.Run(name("tier", "get", width), func(b *testing.B) {
			b.SetBytes(int64(width * benchBlock))
			req := offload.Background("bench")
			for i := 0; i < b.N; i++ {
				if res := rt.Run(b, tier, &offload.Job{ID: uint64(i), Keys: loadKeys, Slots: rt.Slots(0, width), Arena: dst, Promotion: true, Req: req}); !res.Success {
					b.Fatal(res.Err)
				}
			}
		})
		b.Run(name("bare", "get", width), func(b *testing.B) {
			b.SetBytes(int64(width * benchBlock))
			for i := 0; i < b.N; i++ {
				parallel(width, func(j int) {
					out, err := bare.GetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String(cfg.Bucket), Key: aws.String("bare/" + bareKeys[j].HexHash())})
					if err != nil {
						b.Error(err)
						return
					}
					slot, _ := dst.Slot(int64(j))
					io.ReadFull(out.Body, slot)
					out.Body.Close()
				})
			}
		})
	}
}

func name(who, op string, width int) string {
	return who + "_" + op + "_x" + strconv.Itoa(width)
}

func parallel(n int, fn func(i int)) {
	if n == 1 {
		fn(0)
		return
	}
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); fn(i) }()
	}
	wg.Wait()
}
