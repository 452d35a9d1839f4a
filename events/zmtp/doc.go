// Package zmtp is a small pure-Go implementation of the ZeroMQ message
// transport protocol (ZMTP 3.0/3.1, rfc.zeromq.org specs 23 and 37) with
// the NULL security mechanism: a PUB socket, a ROUTER socket driven by a
// request handler, and a client connection for SUB and DEALER peers. It
// speaks to libzmq (pyzmq, pebbe/zmq4, cppzmq) over tcp:// and ipc://.
//
// It exists because kvtier's event publisher needs two properties that the
// pure-Go go-zeromq/zmq4 v0.17 lacks: every
// subscriber has its own bounded queue and writer, so a subscriber that
// stops reading only loses its own messages; and Close drains the queues
// before closing. libzmq through cgo has both but would make the daemon's
// build depend on a C library and a C toolchain.
//
// Scope: no CURVE/PLAIN security, no inproc, no heartbeat initiation (PING
// from a peer is answered), no ZMTP 1.0/2.0 peers.
package zmtp
