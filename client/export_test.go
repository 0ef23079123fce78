package client

// QueueLen returns how many calls of c wait in its own queue for lock
// name (see queue.go): for tests that must know a call has queued.
func (c *Client) QueueLen(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queues[name])
}
