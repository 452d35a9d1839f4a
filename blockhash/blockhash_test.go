package blockhash

import (
	"encoding/hex"
	"errors"
	"testing"

	"github.com/kvtier/kvtier/offload"
)

// Golden hashes computed with vLLM 0.33's hash_block_tokens (the suite
// checks 1 200 random prompts against the installed vLLM in
// python/tests/test_keys.py; these keep the package honest without it).
func TestGoldenHashes(t *testing.T) {
	big := []int64{0, 255, 256, 65535, 65536, 1<<31 - 1, 1 << 31, 1 << 40}
	lora := &LoRA{Name: "ad", Path: "/m/ad"}
	for _, c := range []struct {
		algo   string
		tokens []int64
		salt   string
		lora   *LoRA
		want   []string
	}{
		{SHA256, []int64{1, 2, 3, 4, 5, 6, 7, 8, 9}, "", nil, []string{
			"52a7f141c60918f65779927090482b5a24adbe68c8613a211a1eb4e3edd9361a",
			"bee96bce54f5fcaba04c4a3fc2491b30b48e29dbbd38a327d41bc1f76b956dde"}},
		{SHA256, big, "t1", lora, []string{
			"2324170524df39adcb11c41c5b2627cb5e52adc62ad134b54c0c16037ac693b5",
			"1d7ca58f90661597b7eb365831065657312d0af457390b6ba477008d81121207"}},
		{SHA256CBOR, []int64{1, 2, 3, 4, 5, 6, 7, 8}, "", nil, []string{
			"58d0879dff3800f65f8c5fd449d73048c0f7699dd238a03b84b146b151d55111",
			"e1bc29393a2da9fd798f35ff04d215f846aee6df4b803ce3d43b57df56b58fb1"}},
		{SHA256CBOR, big, "t1", lora, []string{
			"6ca2dd55cc9deb4ee7be661f66aa99c4cb09ca08c724c18dac39d4edcc37ca7a",
			"9a16e46fdb099516b3733945c6e520115632c56210b5faf9b9af84e7921abc29"}},
	} {
		h, err := New(Options{Algo: c.algo, HashBlockSize: 4, TokensPerKey: 8, CacheSalt: c.salt, LoRA: c.lora})
		if err != nil {
			t.Fatal(err)
		}
		got := h.BlockHashes(c.tokens)
		if len(got) != len(c.want) {
			t.Fatalf("%s: %d hashes, want %d", c.algo, len(got), len(c.want))
		}
		for i := range got {
			if hex.EncodeToString(got[i]) != c.want[i] {
				t.Errorf("%s %v block %d: %x, want %s", c.algo, c.tokens, i, got[i], c.want[i])
			}
		}
		// One key per full chunk of 8: the second hash, group suffixed.
		keys := h.Keys(c.tokens, 5)
		if len(keys) != 1 || keys[0] != offload.MakeKey(got[1], 5) {
			t.Errorf("%s: keys %v", c.algo, keys)
		}
	}
}

func TestSeedIsNoneHashInput(t *testing.T) {
	for algo, want := range map[string]string{
		SHA256:     "c0bc02c9fc92a4944335649961b9e55cc41b194bece4801e8c6ef0f0f3f5884a",
		SHA256CBOR: "9fa6eb003f14425eb9c8e6baacfbcaab26257357b829c7bfa74ffcc4f31c1780",
	} {
		h, err := New(Options{Algo: algo, Seed: "42", HashBlockSize: 16})
		if err != nil {
			t.Fatal(err)
		}
		if got := hex.EncodeToString(h.noneHash); got != want {
			t.Errorf("%s: NONE_HASH of seed 42 %s, want %s", algo, got, want)
		}
	}
}

func TestOptionsRefused(t *testing.T) {
	for _, o := range []Options{
		{HashBlockSize: 0},
		{HashBlockSize: maxBlockTokens + 1},
		{HashBlockSize: 16, TokensPerKey: 24},
		{HashBlockSize: 16, Algo: "xxhash"},
		{HashBlockSize: 16, CacheSalt: string(make([]byte, maxExtra+1))},
	} {
		if _, err := New(o); !errors.Is(err, ErrOptions) {
			t.Errorf("%+v: %v, want ErrOptions", o, err)
		}
	}
}

func TestLongEncoding(t *testing.T) {
	for x, want := range map[int64]string{
		1 << 31:        "0000008000",
		1 << 40:        "000000000001",
		-1<<31 - 1:     "ffffff7fff",
		1<<63 - 1:      "ffffffffffffff7f",
		-1 << 63:       "0000000000000080",
		-(1 << 40) - 1: "fffffffffffe",
	} {
		if got := hex.EncodeToString(encodeLong(x)); got != want {
			t.Errorf("encodeLong(%d) = %s, want %s", x, got, want)
		}
	}
}

// A partial block has no hash and a partial chunk no key.
func TestPartialBlocks(t *testing.T) {
	h, _ := New(Options{HashBlockSize: 4, TokensPerKey: 8})
	if n := len(h.BlockHashes(make([]int64, 7))); n != 1 {
		t.Errorf("7 tokens: %d hashes", n)
	}
	if n := len(h.Keys(make([]int64, 15), 0)); n != 1 {
		t.Errorf("15 tokens: %d keys", n)
	}
	if n := len(h.Keys(nil, 0)); n != 0 {
		t.Errorf("no tokens: %d keys", n)
	}
}
