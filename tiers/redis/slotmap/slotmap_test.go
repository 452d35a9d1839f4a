package slotmap

import (
	"fmt"
	"testing"
)

// The key slots Redis documents (cluster spec: "123456789" hashes to
// 0x31C3) and that `redis-cli cluster keyslot` prints.
func TestSlot(t *testing.T) {
	for _, c := range []struct {
		key  string
		want int
	}{
		{"123456789", 0x31C3 % Slots},
		{"foo", 12182},
		{"a", 15495},
		{"b", 3300},
		{"", 0},
		{"{user1000}.following", Slot("user1000")},
		{"{user1000}.followers", Slot("user1000")},
		{"foo{}{bar}", Slot("foo{}{bar}")}, // empty first tag: the whole key
		{"foo{{bar}}zap", Slot("{bar")},
		{"foo{bar}{zap}", Slot("bar")},
	} {
		if got := Slot(c.key); got != c.want {
			t.Errorf("Slot(%q) = %d, want %d", c.key, got, c.want)
		}
	}
}

func TestMap(t *testing.T) {
	m := New([]Range{{0, 5460, "a:1"}, {5461, 10922, "b:1"}, {10923, 16383, "c:1"}, {20000, 30000, "d:1"}, {5, 6, ""}})
	if got := m.Masters(); fmt.Sprint(got) != "[a:1 b:1 c:1 d:1]" {
		t.Fatalf("masters %v", got)
	}
	for key, want := range map[string]string{"b": "a:1", "foo": "c:1", "a": "c:1"} {
		if got := m.Master(key); got != want {
			t.Errorf("Master(%q) = %q, want %q", key, got, want)
		}
	}
	if m.Covered() != Slots {
		t.Fatalf("covered %d", m.Covered())
	}
	part := New([]Range{{0, 99, "a:1"}})
	if part.Covered() != 100 || part.MasterOf(100) != "" || part.MasterOf(-1) != "" || part.MasterOf(Slots) != "" {
		t.Fatal("partial map")
	}
	var none *Map
	if none.Master("x") != "" || none.Masters() != nil || none.Covered() != 0 {
		t.Fatal("nil map routes")
	}
}

func FuzzSlot(f *testing.F) {
	f.Add("foo{bar}")
	f.Fuzz(func(t *testing.T, key string) {
		if s := Slot(key); s < 0 || s >= Slots {
			t.Fatalf("slot %d", s)
		}
	})
}

func BenchmarkSlot(b *testing.B) {
	key := "kvtier:model:2097152:0123456789abcdef0123456789abcdef:0"
	for b.Loop() {
		Slot(key)
	}
}
