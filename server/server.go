package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/api/wire"
	"github.com/kvtier/kvtier/budget"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/ratelog"
	"github.com/kvtier/kvtier/region"
	"github.com/kvtier/kvtier/ticket"
)

// Config configures a Server.
type Config struct {
	// Namespaces served; names must be unique. A namespace named "" is the
	// default one (calls that name no namespace).
	Namespaces []NamespaceConfig
	// UnixSocket is the API's Unix socket path ("" for none). It is created
	// 0600; a stale socket left by a dead daemon is replaced, a live one is
	// an error. The arena side channel listens on UnixSocket + ".arena".
	UnixSocket string
	// TCPAddr is the API's TCP address, e.g. "127.0.0.1:7070" ("" for
	// none; port 0 picks a free port).
	TCPAddr string
	// AuthToken, if set, is the admin's: required as "authorization:
	// Bearer <token>" metadata, on TCP and on the Unix socket (but see
	// UnixPeers). Without any token (no AuthToken, no tenants) the Unix
	// socket relies on its file permissions: every caller there is the
	// admin.
	AuthToken string
	// UnixPeers names, by user id (SO_PEERCRED), who a call on the Unix
	// socket that sends no token is when the daemon has tokens: "admin" or
	// a tenant's name. A uid not listed gets UNAUTHENTICATED.
	UnixPeers map[int]string
	// Tenants and SharedSpaces divide the daemon between customers
	// (tenants.go). With tenants, TCP callers need a token even when
	// AuthToken is empty.
	Tenants      []TenantConfig
	SharedSpaces []SharedSpaceConfig
	// TLS, if set, secures the TCP API (package tlsconfig builds it; with
	// ClientCAs it requires client certificates) and the block stream.
	TLS *tls.Config
	// StreamAddr is the block stream's TCP address ("" for none; port 0
	// picks a free port). Peers learn the bound address from Stats.
	StreamAddr string
	// MetricsAddr serves Prometheus /metrics ("" for none).
	MetricsAddr string
	Limits      Limits
	Logger      *slog.Logger
	// WarningLog tunes the rate-limited logging of filter warnings.
	WarningLog offload.WarningLogOptions
	// Engines, if set, lets vLLM engines attach in manager mode
	// (EngineAttach): it builds the namespace of an engine layout the
	// first time one attaches. MaxNamespaces bounds the namespaces in all
	// (default 8 plus the configured ones).
	Engines       EngineFactory
	MaxNamespaces int
	// Regions, if set, serves vLLM tier mode: engines register their
	// regions on UnixSocket + ".region" and call the Region RPCs. The
	// server closes it at Shutdown.
	Regions *region.Service
}

// Server is the kvtier daemon.
type Server struct {
	cfg    Config
	limits Limits
	log    *slog.Logger
	// sideLogs bounds the lines of the side sockets' refusals (arena
	// descriptors, region registrations): one per interval with a count.
	sideLogs ratelog.Limiter
	// sideRefused counts arena side-channel connections refused because
	// too many exchanges were in flight.
	sideRefused atomic.Uint64
	// draining is set when Shutdown begins (/readyz answers 503).
	draining   atomic.Bool
	nsMu       sync.RWMutex // namespaces and order grow when engines attach
	namespaces map[string]*Namespace
	order      []*Namespace
	metrics    *metrics
	tenancy    *tenancy
	// recvBudget bounds the request bytes being received (receive.go).
	recvBudget *budget.Budget
	warnings   *offload.WarningLog

	unixSrv, tcpSrv *grpc.Server
	health          *health.Server
	unixLn, tcpLn   net.Listener
	fdLn            *net.UnixListener
	httpSrv         *http.Server
	httpLn          net.Listener
	fdPath          string

	// tickets open the arena side channel once each (fdpass.go); nil for
	// a daemon without tokens, whose side channel needs none.
	tickets *ticket.Book
	// holds counts the slots tenants' stream requests keep (holds.go).
	holds holds
	// regionClaims records who drives each tier-mode region (region.go).
	regionClaims regionClaims

	sessions   *sessions
	paramTotal atomic.Int64
	// stopJanitor stops the request expiry and auto-step loop.
	stopJanitor context.CancelFunc
	// connLimit is each listener's connection bound after fitting it to
	// the file descriptor limit.
	connLimit int

	wg           sync.WaitGroup
	fdWG         sync.WaitGroup // side-channel exchanges; they read the arena's descriptor
	attachMu     sync.Mutex     // serialises creating engine namespaces
	regions      *region.Service
	regionLn     *net.UnixListener
	regionPath   string
	regionWG     sync.WaitGroup // region connections
	streamLn     net.Listener
	streamWG     sync.WaitGroup // block-stream connections and their accept loop
	streamMu     sync.Mutex
	streamConns  map[net.Conn]struct{}
	streamClosed bool          // set by stopStreams: accepted connections close at once
	regionStop   chan struct{} // closed at shutdown: every region closes
	shutdownOnce sync.Once
	shutdownErr  error
}

// New validates cfg and builds a Server; Start opens its listeners.
func New(cfg Config) (*Server, error) {
	limits, err := cfg.Limits.withDefaults()
	if err != nil {
		return nil, err
	}
	if len(cfg.Namespaces) == 0 && cfg.Regions == nil && cfg.Engines == nil {
		return nil, errors.New("server: no namespace configured")
	}
	if cfg.UnixSocket == "" && cfg.TCPAddr == "" {
		return nil, errors.New("server: neither a Unix socket nor a TCP address configured")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	tn, err := newTenancy(cfg.AuthToken, cfg.Tenants, cfg.SharedSpaces)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	if err := tn.setUnixPeers(cfg.UnixPeers); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	recv, err := newReceiveBudget(limits, tn.on())
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	s := &Server{
		recvBudget: recv,
		tenancy:    tn,
		cfg:        cfg,
		limits:     limits,
		log:        log,
		namespaces: make(map[string]*Namespace),
		metrics:    newMetrics(),
		regions:    cfg.Regions,
		regionStop: make(chan struct{}),
	}
	if !tn.open() {
		s.tickets = ticket.New(arenaTicketTTL, maxArenaTickets)
	}
	s.sessions = newSessions(s)
	wopts := cfg.WarningLog
	onCount := wopts.OnCount
	wopts.OnCount = func(reason string) {
		s.metrics.filterWarnings.WithLabelValues(reason).Inc()
		if onCount != nil {
			onCount(reason)
		}
	}
	s.warnings = offload.NewWarningLog(log, wopts)
	for _, nc := range cfg.Namespaces {
		if _, dup := s.namespaces[nc.Name]; dup {
			return nil, fmt.Errorf("server: namespace %q configured twice", nc.Name)
		}
		ns, err := newNamespace(nc, limits, log, s.warnings.Record, &s.paramTotal)
		if err != nil {
			return nil, fmt.Errorf("server: %w", err)
		}
		s.namespaces[nc.Name] = ns
		s.order = append(s.order, ns)
	}
	if s.cfg.MaxNamespaces <= 0 {
		s.cfg.MaxNamespaces = len(cfg.Namespaces) + 8
	}
	s.metrics.register(s)
	return s, nil
}

func (s *Server) namespaceNames() []string {
	all := s.allNamespaces()
	names := make([]string, 0, len(all))
	for _, ns := range all {
		names = append(names, fmt.Sprintf("%q", ns.name))
	}
	slices.Sort(names)
	return names
}

// Namespace returns the namespace called name.
func (s *Server) Namespace(name string) (*Namespace, bool) {
	s.nsMu.RLock()
	defer s.nsMu.RUnlock()
	ns, ok := s.namespaces[name]
	return ns, ok
}

// allNamespaces returns the namespaces in the order they were added.
func (s *Server) allNamespaces() []*Namespace {
	s.nsMu.RLock()
	defer s.nsMu.RUnlock()
	return slices.Clone(s.order)
}

// grpcServer returns the API's server for the Unix socket (gate nil: its
// callers are local, known by their uid) or for TCP (gate: the TCP
// listener's authGate, whose connections its tap check marks
// authenticated).
func (s *Server) grpcServer(gate *authGate) *grpc.Server {
	codec := wire.NewServerCodec()
	local := gate == nil
	var opts []grpc.ServerOption
	switch {
	case local:
		opts = append(opts, grpc.Creds(peerCredentials{}))
	case s.cfg.TLS != nil:
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.cfg.TLS)))
	}
	tenancyStream := s.tenancy.stream(local)
	opts = append(opts,
		// Credentials are checked before a request's body is read (a
		// daemon without tokens has none to check on its Unix socket),
		// and the call is given what receive needs.
		grpc.InTapHandle(s.tap(gate, !local || !s.tenancy.open())),
		grpc.MaxRecvMsgSize(s.limits.MaxMessageBytes),
		grpc.MaxSendMsgSize(s.limits.MaxMessageBytes),
		grpc.MaxConcurrentStreams(uint32(s.limits.MaxStreamsPerConnection)),
		// A client that connects and says nothing must not hold a
		// connection slot for long.
		grpc.ConnectionTimeout(5*time.Second),
		experimental.BufferPool(wire.Pool),
		// A call sends at most receiveWindow before its handler reads
		// the request (receive.go); gRPC then opens the stream's window
		// to the message's size, so a PutBlocks still goes out in one
		// round trip. The connection's window stays large: gRPC
		// returns it as data arrives, and blocks are megabytes.
		grpc.InitialWindowSize(receiveWindow),
		grpc.InitialConnWindowSize(wire.WindowSize),
		grpc.ReadBufferSize(wire.IOBufferSize),
		grpc.WriteBufferSize(wire.IOBufferSize),
		grpc.ForceServerCodecV2(codec),
		// Every connection is a session (session.go); keep-alive pings
		// find peers that vanished, and idle connections are closed.
		grpc.StatsHandler(s.sessions),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: s.limits.ConnectionIdleTimeout,
			Time:              s.limits.KeepaliveTime,
			Timeout:           s.limits.KeepaliveTimeout,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		// Unary methods are served as streams (receive.go) and run the
		// unary chain themselves.
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if unaryMethod(info) {
				return h(srv, ss)
			}
			return tenancyStream(srv, ss, info, h)
		}),
	)
	g := grpc.NewServer(opts...)
	chain := chainUnary(s.tenancy.unary(local), s.metrics.unaryInterceptor)
	g.RegisterService(s.serviceDesc(&kvtierv1.KVTier_ServiceDesc, codec, chain), &service{s: s})
	// Every service on this server receives through receive, the health
	// service too.
	g.RegisterService(s.serviceDesc(&healthpb.Health_ServiceDesc, codec, chain), s.health)
	return g
}

// Start opens the listeners and serves in the background. On error,
// everything opened so far is closed again.
func (s *Server) Start() (err error) {
	s.health = health.NewServer()
	defer func() {
		if err != nil {
			s.closeListeners()
		}
	}()
	if err := s.listen(); err != nil {
		return err
	}
	s.serveListeners()
	jctx, stop := context.WithCancel(context.Background())
	s.stopJanitor = stop
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.janitor(jctx)
	}()
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.log.Info("kvtier API listening", "unix", s.UnixAddr(), "tcp", s.TCPAddr(), "metrics", s.MetricsAddr(), "token_required", s.cfg.AuthToken != "" || s.tenancy.on(), "tenants", len(s.tenancy.tenants))
	return nil
}

// listen opens every configured listener: the API's Unix socket with its
// arena side channel (and the region socket of tier mode), the API's TCP
// port, the block stream and the metrics port. On an error the caller
// closes what was opened.
func (s *Server) listen() error {
	if s.cfg.UnixSocket != "" {
		ln, err := listenUnix(s.cfg.UnixSocket)
		if err != nil {
			return fmt.Errorf("server: %w", err)
		}
		s.unixLn = ln
		// GetArena hands this path to clients, whose working directory
		// is not ours (the default socket is ./kvtier.sock).
		abs, err := filepath.Abs(s.cfg.UnixSocket)
		if err != nil {
			return fmt.Errorf("server: %w", err)
		}
		s.fdPath = abs + ".arena"
		fdl, err := listenUnix(s.fdPath)
		if err != nil {
			return fmt.Errorf("server: arena side channel: %w", err)
		}
		s.fdLn = fdl.(*net.UnixListener)
		if s.regions != nil {
			s.regionPath = abs + ".region"
			rl, err := listenUnix(s.regionPath)
			if err != nil {
				return fmt.Errorf("server: region socket: %w", err)
			}
			s.regionLn = rl.(*net.UnixListener)
		}
	}
	if s.cfg.TCPAddr != "" {
		ln, err := net.Listen("tcp", s.cfg.TCPAddr)
		if err != nil {
			return fmt.Errorf("server: listen on %s: %w", s.cfg.TCPAddr, err)
		}
		s.tcpLn = ln
	}
	if s.cfg.StreamAddr != "" {
		ln, err := net.Listen("tcp", s.cfg.StreamAddr)
		if err != nil {
			return fmt.Errorf("server: block stream: listen on %s: %w", s.cfg.StreamAddr, err)
		}
		if s.cfg.TLS != nil {
			c := s.cfg.TLS.Clone()
			c.NextProtos = nil
			ln = tls.NewListener(ln, c)
		}
		s.streamLn = ln
	}
	if s.cfg.MetricsAddr != "" {
		ln, err := net.Listen("tcp", s.cfg.MetricsAddr)
		if err != nil {
			return fmt.Errorf("server: metrics: listen on %s: %w", s.cfg.MetricsAddr, err)
		}
		s.httpLn = ln
	}
	return nil
}

// serveListeners starts the accept loop of every open listener, each
// bounded to the fitted connection limit.
func (s *Server) serveListeners() {
	s.connLimit = FitConnections(s.limits.MaxConnections, s.log)
	if s.unixLn != nil {
		s.unixSrv = s.grpcServer(nil)
		ln := newCredListener(s.unixLn.(*net.UnixListener), s.connLimit)
		s.serve("unix", func() error { return s.unixSrv.Serve(ln) })
		// The accept loop counts in fdWG too, so that no exchange can be
		// added once shutdown waits for them.
		s.fdWG.Add(1)
		go func() {
			defer s.fdWG.Done()
			if err := s.serveFDs(s.fdLn); err != nil && !errors.Is(err, net.ErrClosed) {
				s.log.Error("listener stopped", "listener", "arena", "err", err)
			}
		}()
		if s.regionLn != nil {
			s.regionWG.Add(1)
			go func() {
				defer s.regionWG.Done()
				if err := s.serveRegions(s.regionLn); err != nil && !errors.Is(err, net.ErrClosed) {
					s.log.Error("listener stopped", "listener", "region", "err", err)
				}
			}()
		}
	}
	if s.tcpLn != nil {
		perPeer := s.limits.MaxConnectionsPerPeer
		if perPeer == 0 {
			perPeer = max(s.connLimit/4, 1)
		}
		gate := newAuthGate(s.tcpLn, s.connLimit, perPeer, s.limits.AuthTimeout, func(reason string) {
			s.metrics.authRefusals.WithLabelValues("tcp", reason).Inc()
			s.sideLogs.Warn(s.log, "auth-"+reason, "API connection closed before it authenticated", "reason", reason,
				"auth_timeout", s.limits.AuthTimeout, "max_connections", s.connLimit)
		}, func(host string) {
			s.metrics.authRefusals.WithLabelValues("tcp", "per_peer").Inc()
			s.sideLogs.Warn(s.log, "auth-per-peer", "API connection refused: its host has its share of the connections, all authenticated",
				"host", host, "max_connections_per_peer", perPeer)
		})
		s.tcpSrv = s.grpcServer(gate)
		s.serve("tcp", func() error { return s.tcpSrv.Serve(gate) })
	}
	if s.streamLn != nil {
		s.streamConns = map[net.Conn]struct{}{}
		s.streamWG.Add(1)
		go func() {
			defer s.streamWG.Done()
			if err := s.serveStream(s.streamLn, s.connLimit); !errors.Is(err, net.ErrClosed) {
				s.log.Error("listener stopped", "listener", "block stream", "err", err)
			}
		}()
	}
	if s.httpLn != nil {
		mux := http.NewServeMux()
		mux.Handle("/metrics", s.metrics.handler())
		// Probes (a Kubernetes kubelet's): live while the process serves
		// HTTP at all; ready while the API serves, not once a shutdown
		// has begun draining.
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
		mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
			if s.draining.Load() {
				http.Error(w, "draining", http.StatusServiceUnavailable)
				return
			}
			_, _ = w.Write([]byte("ok\n"))
		})
		s.httpSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		s.serve("metrics", func() error { return s.httpSrv.Serve(s.httpLn) })
	}
}

func (s *Server) serve(what string, fn func() error) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := fn(); err != nil && !errors.Is(err, grpc.ErrServerStopped) && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			s.log.Error("listener stopped", "listener", what, "err", err)
		}
	}()
}

// UnixAddr, TCPAddr and MetricsAddr return the bound addresses ("" when
// not listening).
func (s *Server) UnixAddr() string {
	if s.unixLn == nil {
		return ""
	}
	return s.cfg.UnixSocket
}

// TCPAddr returns the bound TCP address of the API.
func (s *Server) TCPAddr() string {
	if s.tcpLn == nil {
		return ""
	}
	return s.tcpLn.Addr().String()
}

// MetricsAddr returns the bound address of /metrics.
func (s *Server) MetricsAddr() string {
	if s.httpLn == nil {
		return ""
	}
	return s.httpLn.Addr().String()
}

func (s *Server) fdSocketPath() string {
	if s.fdLn == nil {
		return ""
	}
	return s.fdPath
}

// Shutdown stops accepting calls, waits for in-flight calls until ctx
// ends (then cancels them), closes every namespace (draining tier jobs and
// flushing events within ctx), and removes the sockets. It is idempotent.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutdownOnce.Do(func() { s.shutdownErr = s.shutdown(ctx) })
	return s.shutdownErr
}

func (s *Server) shutdown(ctx context.Context) error {
	s.draining.Store(true)
	if s.health != nil {
		s.health.Shutdown()
	}
	if s.stopJanitor != nil {
		s.stopJanitor()
	}
	// Remove the socket names first so that no new client finds us.
	if s.unixLn != nil {
		os.Remove(s.cfg.UnixSocket)
	}
	if s.fdLn != nil {
		s.fdLn.Close()
		os.Remove(s.fdPath)
	}
	// Closing a namespace unmaps and closes its arena: no exchange may
	// still be reading the descriptor.
	s.fdWG.Wait()
	if s.regionLn != nil {
		s.regionLn.Close()
		os.Remove(s.regionPath)
	}
	var stopped sync.WaitGroup
	for _, g := range []*grpc.Server{s.unixSrv, s.tcpSrv} {
		if g == nil {
			continue
		}
		stopped.Add(1)
		go func() {
			defer stopped.Done()
			g.GracefulStop()
		}()
	}
	done := make(chan struct{})
	go func() { stopped.Wait(); close(done) }()
	// In-flight calls get half of the time left; draining the tiers and
	// flushing events the rest, so that connections a client never used
	// (still in their handshake) cannot eat the drain.
	gctx := ctx
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		gctx, cancel = context.WithDeadline(ctx, time.Now().Add(time.Until(dl)/2))
		defer cancel()
	}
	select {
	case <-done:
	case <-gctx.Done():
		s.log.Warn("shutdown: calls still in flight after half the shutdown timeout; cancelling them")
		for _, g := range []*grpc.Server{s.unixSrv, s.tcpSrv} {
			if g != nil {
				g.Stop()
			}
		}
		<-done
	}
	// Block-stream writes read pinned arena slots: end them before any
	// namespace unmaps its arena.
	s.stopStreams()
	var errs []error
	if s.regions != nil {
		// Every region closes (waiting for its transfers) and its engine
		// sees end-of-file; then the namespaces' tiers close.
		close(s.regionStop)
		s.regionWG.Wait()
		if err := s.regions.Close(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	for _, ns := range s.allNamespaces() {
		if err := ns.Close(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if s.httpSrv != nil {
		hctx, cancel := context.WithTimeout(context.Background(), time.Second)
		s.httpSrv.Shutdown(hctx)
		cancel()
	}
	s.closeListeners()
	s.wg.Wait()
	return errors.Join(errs...)
}

// StreamAddr returns the block stream's bound address ("" for none).
func (s *Server) StreamAddr() string {
	if s.streamLn == nil {
		return ""
	}
	return s.streamLn.Addr().String()
}

// stopStreams closes the block stream's listener and connections and waits
// for their goroutines.
func (s *Server) stopStreams() {
	if s.streamLn == nil {
		return
	}
	s.streamLn.Close()
	s.streamMu.Lock()
	s.streamClosed = true
	for c := range s.streamConns {
		c.Close()
	}
	s.streamMu.Unlock()
	s.streamWG.Wait()
}

func (s *Server) closeListeners() {
	for _, ln := range []net.Listener{s.unixLn, s.tcpLn, s.httpLn, s.streamLn} {
		if ln != nil {
			ln.Close()
		}
	}
	if s.fdLn != nil {
		s.fdLn.Close()
		os.Remove(s.fdPath)
	}
	if s.regionLn != nil {
		s.regionLn.Close()
		os.Remove(s.regionPath)
	}
	if s.unixLn != nil {
		os.Remove(s.cfg.UnixSocket)
	}
}
