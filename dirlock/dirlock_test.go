package dirlock

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

func TestAcquireExcludesOthers(t *testing.T) {
	dir := t.TempDir()
	l, err := Acquire(dir, "test")
	if err != nil {
		t.Fatal(err)
	}
	// flock locks belong to open file descriptions: a second open in the
	// same process conflicts like another process would.
	if _, err := Acquire(dir, "second"); !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "pid") {
		t.Fatalf("second lock: %v, want ErrLocked naming the pid", err)
	}
	if held, who := Held(dir); !held || !strings.Contains(who, "test") {
		t.Fatalf("Held = %v, %q", held, who)
	}
	l.Release()
	l.Release()
	if held, _ := Held(dir); held {
		t.Fatal("held after release")
	}
	l2, err := Acquire(dir, "again")
	if err != nil {
		t.Fatal(err)
	}
	l2.Release()
}

// A process that dies holding the lock leaves no stale lock.
func TestDeadHolderReleases(t *testing.T) {
	if os.Getenv("DIRLOCK_HOLD") != "" {
		if _, err := Acquire(os.Getenv("DIRLOCK_HOLD"), "child"); err != nil {
			os.Exit(2)
		}
		os.Stdout.WriteString("locked\n")
		select {}
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestDeadHolderReleases$")
	cmd.Env = append(os.Environ(), "DIRLOCK_HOLD="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 7)
	if _, err := out.Read(buf); err != nil || string(buf) != "locked\n" {
		t.Fatalf("child: %q, %v", buf, err)
	}
	if _, err := Acquire(dir, "parent"); !errors.Is(err, ErrLocked) {
		t.Fatalf("lock while the child holds it: %v", err)
	}
	cmd.Process.Kill()
	cmd.Wait()
	l, err := Acquire(dir, "parent")
	if err != nil {
		t.Fatalf("lock after the holder was killed: %v", err)
	}
	l.Release()
}
