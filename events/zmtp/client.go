package zmtp

import (
	"context"
	"errors"
)

// ClientMaxFrame bounds inbound frames on client connections, which carry
// whole event batches.
const ClientMaxFrame = 256 << 20

// Dial connects to endpoint and handshakes as a socketType peer (SUB,
// DEALER, ...), bounded by ctx. It is the client side used by tests and
// tools: one connection, no reconnection.
func Dial(ctx context.Context, endpoint, socketType string, identity []byte) (*Conn, error) {
	nc, err := dial(ctx, endpoint)
	if err != nil {
		return nil, err
	}
	c, err := Handshake(ctx, nc, socketType, identity, ClientMaxFrame)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return c, nil
}

// Subscribe sends a subscription in the ZMTP 3.0 message form (0x01 +
// prefix), which every ZMTP 3 publisher accepts.
func (c *Conn) Subscribe(prefix []byte) error {
	return c.Send(append([]byte{1}, prefix...))
}

// Cancel withdraws a subscription in the ZMTP 3.0 message form.
func (c *Conn) Cancel(prefix []byte) error {
	return c.Send(append([]byte{0}, prefix...))
}

// SubscribeCommand sends a subscription as the ZMTP 3.1 SUBSCRIBE command.
func (c *Conn) SubscribeCommand(prefix []byte) error {
	if err := c.WriteCommand("SUBSCRIBE", prefix); err != nil {
		return err
	}
	return c.Flush()
}

// Send writes a multipart message and flushes it.
func (c *Conn) Send(frames ...[]byte) error {
	if err := c.WriteMessage(frames); err != nil {
		return err
	}
	return c.Flush()
}

// Recv returns the next message, answering PING and skipping other
// commands. Set a read deadline on NetConn to bound the wait.
func (c *Conn) Recv() ([][]byte, error) {
	for {
		msg, cmd, err := c.Read()
		if err != nil {
			return nil, err
		}
		switch cmd.Name {
		case "":
			return msg, nil
		case "PING":
			if err := c.WriteCommand("PONG", pong(cmd.Data)); err != nil {
				return nil, err
			}
			if err := c.Flush(); err != nil {
				return nil, err
			}
		case "ERROR":
			return nil, errors.Join(ErrIncompatible, errors.New(errorReason(cmd.Data)))
		}
	}
}
