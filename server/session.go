package server

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/stats"
)

// A session is one client connection. It owns the requests it registers,
// and through them the pins and reservations those requests hold; when
// the connection ends (the client closed it, the process died, keep-alive
// pings went unanswered, or the daemon closed an idle one), everything it
// owned is released exactly once, so an engine that dies costs the others
// nothing. Request ids are scoped to their session: two engines may use
// the same ids.
type session struct {
	id    uint64
	peer  string
	start time.Time
	// closed is set before the session's state is released; a call that
	// finds it set starts nothing new.
	closed atomic.Bool
	// paramBytes counts the kv_transfer_params bytes its requests hold,
	// against Limits.MaxSessionParamsBytes.
	paramBytes atomic.Int64
}

func (s *session) String() string {
	if s == nil {
		return "in-process"
	}
	return fmt.Sprintf("session %d (%s)", s.id, s.peer)
}

// scope returns the manager-wide id of the session's request id.
func (s *session) scope(id string) string {
	if s == nil {
		return id
	}
	return fmt.Sprint(s.id, "/", id)
}

type sessionKey struct{}

// sessionOf returns the session of a call's context (nil outside a
// connection, e.g. in-process calls).
func sessionOf(ctx context.Context) *session {
	s, _ := ctx.Value(sessionKey{}).(*session)
	return s
}

// sessions tracks the live sessions and ends them: it is the gRPC stats
// handler of every listener.
type sessions struct {
	srv  *Server
	next atomic.Uint64

	mu   sync.Mutex
	live map[*session]struct{}
	// ended counts sessions ended, released the requests they owned.
	ended, released atomic.Uint64
}

func newSessions(srv *Server) *sessions {
	return &sessions{srv: srv, live: make(map[*session]struct{})}
}

// TagConn starts a session for a new connection.
func (h *sessions) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	s := &session{id: h.next.Add(1), start: time.Now()}
	if info != nil && info.RemoteAddr != nil {
		s.peer = addrString(info.RemoteAddr)
	}
	h.mu.Lock()
	h.live[s] = struct{}{}
	h.mu.Unlock()
	return context.WithValue(ctx, sessionKey{}, s)
}

func addrString(a net.Addr) string {
	if a.Network() == "unix" {
		return "unix"
	}
	return a.String()
}

// HandleConn ends the session when its connection ends.
func (h *sessions) HandleConn(ctx context.Context, st stats.ConnStats) {
	if _, ok := st.(*stats.ConnEnd); !ok {
		return
	}
	if s := sessionOf(ctx); s != nil {
		h.end(s, "connection closed")
	}
}

// TagRPC and HandleRPC are not needed.
func (h *sessions) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (h *sessions) HandleRPC(context.Context, stats.RPCStats)                       {}

// end releases everything s owns, in every namespace, once.
func (h *sessions) end(s *session, why string) {
	if s.closed.Swap(true) {
		return
	}
	h.mu.Lock()
	delete(h.live, s)
	h.mu.Unlock()
	n := 0
	for _, ns := range h.srv.allNamespaces() {
		n += ns.releaseSession(s)
	}
	h.ended.Add(1)
	h.released.Add(uint64(n))
	if n > 0 {
		h.srv.log.Info("session ended: released the requests it owned", "session", s.id, "peer", s.peer, "why", why, "requests", n, "lived", time.Since(s.start).Round(time.Millisecond))
	}
}

// count returns the live sessions.
func (h *sessions) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.live)
}

// janitor ends steps for idle engines (every AutoStepInterval) and
// expires idle requests (every quarter of RequestIdleTimeout) until ctx
// ends.
func (srv *Server) janitor(ctx context.Context) {
	idle := srv.limits.RequestIdleTimeout
	sweepEvery := max(idle/4, 10*time.Millisecond)
	tick := min(sweepEvery, time.Second)
	if a := srv.limits.AutoStepInterval; a > 0 {
		tick = min(tick, max(a/2, 5*time.Millisecond))
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	var swept time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			sweep := now.Sub(swept) >= sweepEvery
			if sweep {
				swept = now
			}
			for _, ns := range srv.allNamespaces() {
				if sweep {
					ns.expireIdle(now.Add(-idle))
				}
				ns.autoStep(now)
			}
		}
	}
}
