package ticket

import (
	"errors"
	"testing"
	"time"

	"pgregory.net/rapid"
)

func TestRedeem(t *testing.T) {
	b := New(time.Minute, 8)
	tk, err := b.Issue("ns")
	if err != nil {
		t.Fatal(err)
	}
	if len(tk) != 32 {
		t.Fatalf("ticket %q: want 32 hex digits", tk)
	}
	other, _ := b.Issue("ns")
	if err := b.Redeem(other, "another"); !errors.Is(err, ErrSubject) {
		t.Fatalf("another subject: %v", err)
	}
	if err := b.Redeem(other, "ns"); !errors.Is(err, ErrUnknown) {
		t.Fatalf("a ticket tried for another subject is spent: %v", err)
	}
	if err := b.Redeem(tk, "ns"); err != nil {
		t.Fatal(err)
	}
	if err := b.Redeem(tk, "ns"); !errors.Is(err, ErrUnknown) {
		t.Fatalf("second use: %v", err)
	}
	for _, bad := range []string{"", "zz", tk[:31], tk + "00", "0123456789abcdef0123456789abcdeg"} {
		if err := b.Redeem(bad, "ns"); !errors.Is(err, ErrUnknown) {
			t.Fatalf("%q: %v", bad, err)
		}
	}
}

func TestExpiry(t *testing.T) {
	now := time.Unix(1000, 0)
	b := New(10*time.Second, 8)
	b.now = func() time.Time { return now }
	tk, _ := b.Issue("ns")
	now = now.Add(10 * time.Second)
	if err := b.Redeem(tk, "ns"); !errors.Is(err, ErrExpired) {
		t.Fatalf("at its expiry: %v", err)
	}
}

// TestModel checks a Book against a map of the tickets it should honour:
// random issues, redeems (right, wrong subject, spent, forged) and clock
// steps. A ticket is honoured at most once, only for its subject, only
// before it expires; the book never holds more than max.
func TestModel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		max := rapid.IntRange(1, 8).Draw(rt, "max")
		ttl := time.Duration(rapid.IntRange(1, 20).Draw(rt, "ttl")) * time.Second
		now := time.Unix(1000, 0)
		b := New(ttl, max)
		b.now = func() time.Time { return now }
		type want struct {
			subject string
			expires time.Time
			spent   bool
		}
		var issued []string
		model := map[string]*want{}
		rt.Repeat(map[string]func(*rapid.T){
			"issue": func(rt *rapid.T) {
				s := rapid.SampledFrom([]string{"a", "b"}).Draw(rt, "subject")
				tk, err := b.Issue(s)
				if err != nil {
					rt.Fatal(err)
				}
				if model[tk] != nil {
					rt.Fatalf("ticket %s issued twice", tk)
				}
				model[tk] = &want{subject: s, expires: now.Add(ttl)}
				issued = append(issued, tk)
			},
			"redeem": func(rt *rapid.T) {
				if len(issued) == 0 {
					rt.Skip("none issued")
				}
				tk := rapid.SampledFrom(issued).Draw(rt, "ticket")
				s := rapid.SampledFrom([]string{"a", "b"}).Draw(rt, "subject")
				w := model[tk]
				err := b.Redeem(tk, s)
				ok := !w.spent && now.Before(w.expires) && w.subject == s
				if err == nil && !ok {
					rt.Fatalf("ticket honoured: spent %v, expired %v, subject %q for %q", w.spent, !now.Before(w.expires), w.subject, s)
				}
				// A live, unspent ticket may only have been forgotten
				// because the book was full.
				if err != nil && ok && !errors.Is(err, ErrUnknown) {
					rt.Fatalf("a good ticket refused: %v", err)
				}
				w.spent = true
			},
			"forged": func(rt *rapid.T) {
				if err := b.Redeem("00112233445566778899aabbccddeeff", "a"); err == nil {
					rt.Fatal("a forged ticket honoured")
				}
			},
			"tick": func(rt *rapid.T) {
				now = now.Add(time.Duration(rapid.IntRange(0, 10).Draw(rt, "s")) * time.Second)
			},
			"": func(rt *rapid.T) {
				if n := b.Len(); n > max {
					rt.Fatalf("%d tickets held, max %d", n, max)
				}
				if len(b.order) > 2*max+1 {
					rt.Fatalf("issue order holds %d entries, max %d", len(b.order), max)
				}
			},
		})
	})
}

// FuzzRedeem: a side-channel client sends any bytes as its ticket; the
// book neither panics nor honours anything but the ticket it issued.
func FuzzRedeem(f *testing.F) {
	f.Add("00112233445566778899aabbccddeeff")
	f.Add("")
	f.Add("0123456789abcdef0123456789abcdef00")
	f.Fuzz(func(t *testing.T, s string) {
		b := New(time.Minute, 4)
		tk, err := b.Issue("ns")
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Redeem(s, "ns"); err == nil && s != tk {
			t.Fatalf("%q honoured, the ticket was %q", s, tk)
		}
	})
}
