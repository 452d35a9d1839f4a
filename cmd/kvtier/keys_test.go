package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/blockhash"
)

func TestKeysCommand(t *testing.T) {
	in := "[1,2,3,4,5,6,7,8]\n\n{\"tokens\":[1,2,3,4,5,6,7,8],\"cache_salt\":\"s\"}\n{\"tokens\":[1,2,3,4],\"lora_name\":\"a\",\"lora_path\":\"/a\"}\n[1,2,3]\n{\"tokens\":\"x\"}\n"
	var out, errb bytes.Buffer
	root := newRootCmd(strings.NewReader(in), &out, &errb)
	root.SetArgs([]string{"keys", "--block-size", "4", "--hashes"})
	if err := root.Execute(); err != nil {
		t.Fatal(err, errb.String())
	}
	var lines []keysLine
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var k keysLine
		if err := json.Unmarshal([]byte(l), &k); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, k)
	}
	if len(lines) != 5 {
		t.Fatalf("%d lines for 5 prompts: %s", len(lines), out.String())
	}
	if len(lines[0].Keys) != 2 || len(lines[1].Keys) != 2 || len(lines[2].Keys) != 1 || len(lines[3].Keys) != 0 || lines[4].Error == "" {
		t.Fatalf("unexpected answers: %+v", lines)
	}
	// The salt changes the first block's hash and with it every later one.
	if lines[0].Keys[0] == lines[1].Keys[0] || lines[0].Keys[1] == lines[1].Keys[1] {
		t.Error("a salted prompt has the unsalted prompt's keys")
	}
	if lines[0].BlockHashes[0]+"00000000" != lines[0].Keys[0] {
		t.Errorf("key %s is not hash %s in group 0", lines[0].Keys[0], lines[0].BlockHashes[0])
	}
}

func FuzzKeysLine(f *testing.F) {
	for _, s := range []string{"[1,2,3,4]", `{"tokens":[1,2,3,4],"cache_salt":"x"}`, `{"lora_name":"a"}`, "[", "{", "[1e99]", `{"tokens":[-1]}`} {
		f.Add(s)
	}
	h, err := blockhash.New(blockhash.Options{HashBlockSize: 2})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, line string) {
		if strings.TrimSpace(line) == "" {
			return // computeKeys skips blank lines
		}
		out := keysFor(h, h.Options(), []byte(line), 0, true)
		if out.Error == "" && out.Keys == nil {
			t.Fatalf("%q: neither keys nor an error", line)
		}
	})
}
