package server_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/cpu"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/server"
	"github.com/kvtier/kvtier/tiering"
)

// TestRelativePathsInGetArena: the embedded default listens on
// ./kvtier.sock, so GetArena must not hand a client in another directory
// a path relative to the daemon's working directory (fd_socket, or a file
// arena's path): the client would connect to nothing.
func TestRelativePathsInGetArena(t *testing.T) {
	for _, kind := range []cpu.ArenaKind{cpu.ArenaMemfd, cpu.ArenaFile} {
		t.Run(string(kind), func(t *testing.T) {
			dir := shortTempDir(t)
			t.Chdir(dir)
			ac := cpu.ArenaConfig{Kind: kind}
			if kind == cpu.ArenaFile {
				ac.Path = "arena"
			}
			p, err := cpu.New(cpu.Config{SlotSize: slotSize, Capacity: 8 * slotSize, Arena: ac})
			if err != nil {
				t.Fatal(err)
			}
			m, err := tiering.New(tiering.Config{Primary: p, Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			srv, err := server.New(server.Config{
				Namespaces: []server.NamespaceConfig{server.ManagerNamespace("", m, p, offload.Parser{})},
				UnixSocket: "./k.sock",
				Logger:     quietLogger(),
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := srv.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				srv.Shutdown(ctx)
			})
			ctx := ctxT(t)
			c := (&env{}).dial(t, filepath.Join(dir, "k.sock"))
			info, err := c.API().GetArena(ctx, &kvtierv1.GetArenaRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if want := filepath.Join(dir, "k.sock.arena"); info.GetFdSocket() != want {
				t.Errorf("fd_socket %q, want %q", info.GetFdSocket(), want)
			}
			if kind == cpu.ArenaFile {
				if want := filepath.Join(dir, "arena"); info.GetPath() != want {
					t.Errorf("path %q, want %q", info.GetPath(), want)
				}
			}
			// A client elsewhere maps the arena.
			t.Chdir(t.TempDir())
			a, err := c.MapArena(ctx)
			if err != nil {
				t.Fatalf("MapArena from another directory: %v", err)
			}
			a.Close()
		})
	}
}
