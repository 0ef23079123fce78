package locktable

// AllEvents returns the events of a result in the order Apply produced
// them, a batch's sub-results flattened in order.
func (r Result) AllEvents() []Event {
	if len(r.Batch) == 0 {
		return r.Events
	}
	n := len(r.Events)
	for _, b := range r.Batch {
		n += len(b.Events)
	}
	out := make([]Event, 0, n)
	out = append(out, r.Events...)
	for _, b := range r.Batch {
		out = append(out, b.Events...)
	}
	return out
}

// FromNewerVersion reports whether an encoded command was written by a
// newer lockd (a command version this one does not know): such an entry is
// not corrupt, this member is too old to follow the log.
func FromNewerVersion(b []byte) bool { return len(b) > 0 && b[0] > commandVersion }
