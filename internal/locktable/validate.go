package locktable

import (
	"errors"
	"fmt"
)

// ErrInvalidCommand is returned by Validate for a command whose encoding
// DecodeCommand would refuse.
var ErrInvalidCommand = errors.New("locktable: command would not decode")

// Validate reports whether c, encoded as one log entry, decodes back: a
// known op, every string within the decoder's bound (maxString bytes), a
// batch only on OpBatch, at most maxBatch commands in it and none of them
// a batch. A member panics on a committed entry it cannot decode, on every
// restart too, so nothing that fails here may be proposed.
//
// A proposer that packs commands into an OpBatch entry of its own must
// also refuse an OpBatch command from its callers: nested, it would not
// decode.
func (c *Command) Validate() error {
	return c.validate(true)
}

func (c *Command) validate(top bool) error {
	if _, ok := opNames[c.Op]; !ok {
		return fmt.Errorf("%w: unknown op %d", ErrInvalidCommand, uint8(c.Op))
	}
	for _, f := range [...]struct {
		name, v string
	}{
		{"lock", c.Lock}, {"client_id", c.ClientID}, {"session_id", c.SessionID},
		{"member_id", c.MemberID}, {"raft_addr", c.RaftAddr}, {"http_addr", c.HTTPAddr},
		{"owner", c.Owner}, {"value", c.Value},
	} {
		if len(f.v) > maxString {
			return fmt.Errorf("%w: %s of %s is %d bytes, the log format's limit is %d",
				ErrInvalidCommand, f.name, c.Op, len(f.v), maxString)
		}
	}
	if c.Mode > Shared {
		return fmt.Errorf("%w: unknown mode %d", ErrInvalidCommand, c.Mode)
	}
	if len(c.Locks) > maxLocks {
		return fmt.Errorf("%w: %d lock names, the log format's limit is %d", ErrInvalidCommand, len(c.Locks), maxLocks)
	}
	for _, n := range c.Locks {
		if len(n) > maxString {
			return fmt.Errorf("%w: a lock name of %d bytes, the log format's limit is %d", ErrInvalidCommand, len(n), maxString)
		}
	}
	if len(c.Batch) == 0 {
		return nil
	}
	if !top || c.Op != OpBatch {
		return fmt.Errorf("%w: a batch inside %s", ErrInvalidCommand, c.Op)
	}
	if len(c.Batch) > maxBatch {
		return fmt.Errorf("%w: batch of %d commands, the limit is %d", ErrInvalidCommand, len(c.Batch), maxBatch)
	}
	for i := range c.Batch {
		if err := c.Batch[i].validate(false); err != nil {
			return fmt.Errorf("batch command %d: %w", i, err)
		}
	}
	return nil
}
