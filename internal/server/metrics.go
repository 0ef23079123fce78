package server

import (
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/lockd/lockd/api"
	"github.com/lockd/lockd/internal/locktable"
	"github.com/lockd/lockd/internal/raftnode"
)

// metrics are registered on the registry passed in the Config, never on a
// global one, so two members in one test process keep separate counters.
type metrics struct {
	reg        prometheus.Registerer
	collectors []prometheus.Collector

	proposeSeconds *prometheus.HistogramVec
	acquireSeconds *prometheus.HistogramVec
	wsSeconds      *prometheus.HistogramVec
	acquires       *prometheus.CounterVec
	events         *prometheus.CounterVec
	grants         prometheus.Counter
	releases       prometheus.Counter
	expiries       prometheus.Counter
	waitTimeouts   prometheus.Counter
	sessionExpired prometheus.Counter
	wsConns        prometheus.Gauge
	refused        *prometheus.CounterVec
}

// Refusal codes and ops, the label values of lockd_requests_refused_total
// (ops are the command's name, or watch): every combination is exported
// from the start (at zero), so a rate over it exists before the first
// refusal.
var (
	refusalCodes = []string{"overloaded", "resource_exhausted"}
	refusalOps   = []string{"acquire", "create_session", "release", "renew", "set_value", "cancel", "delete_session", "revoke", "read", "watch", "other"}
)

func newMetrics(reg *prometheus.Registry, s *Server, extra ...prometheus.Collector) *metrics {
	m := &metrics{reg: reg}
	m.proposeSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "lockd_propose_duration_seconds",
		Help:    "Time from proposing a command to its commit and apply on the leader, by command and outcome.",
		Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .25, .5, 1, 2.5},
	}, []string{"op", "outcome"})
	m.acquireSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "lockd_acquire_duration_seconds",
		Help:    "Acquire requests from arrival to reply, waits included, by outcome.",
		Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"outcome"})
	m.wsSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "lockd_websocket_request_duration_seconds",
		Help: "WebSocket requests from the frame read to the reply queued for the client, by op: the server's share of " +
			"a request's latency (a queued acquire's later grant is not included).",
		Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"op"})
	for _, op := range wsOps {
		m.wsSeconds.WithLabelValues(op) // every series present from the start
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	m.grants = counter("lockd_grants_total", "Locks granted (a re-grant to the holder is not counted).")
	m.releases = counter("lockd_releases_total", "Locks released by their holder.")
	m.expiries = counter("lockd_lock_expiries_total", "Locks released because their TTL ran out.")
	m.waitTimeouts = counter("lockd_wait_timeouts_total", "Waiters that left a queue at their deadline, ungranted.")
	m.sessionExpired = counter("lockd_session_expiries_total", "Sessions ended because no keepalive reached the leader within their TTL.")
	m.wsConns = prometheus.NewGauge(prometheus.GaugeOpts{Name: "lockd_websocket_connections", Help: "Open WebSocket connections."})
	m.acquires = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockd_acquire_total", Help: "Acquire commands by outcome (granted, queued, lock_held, ...).",
	}, []string{"outcome"})
	m.events = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockd_events_total",
		Help: "Committed state changes: grants, releases, expiries, wait timeouts, session expiries.",
	}, []string{"kind"})
	m.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockd_requests_refused_total",
		Help: "Requests (HTTP and WebSocket) this member refused for want of capacity, before anything was proposed: " +
			"code overloaded (503, admission control: the member commits no faster) or resource_exhausted (429: one " +
			"client's or token's budget, a quota, a per-connection bound), by op.",
	}, []string{"code", "op"})
	for _, code := range refusalCodes {
		for _, op := range refusalOps {
			m.refused.WithLabelValues(code, op) // every series present from the start, for rates and alerts
		}
	}
	m.collectors = []prometheus.Collector{
		m.proposeSeconds, m.acquireSeconds, m.wsSeconds, m.acquires, m.events,
		m.grants, m.releases, m.expiries, m.waitTimeouts, m.sessionExpired, m.wsConns, m.refused,
		newStateCollector(s),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "lockd_admission_outstanding",
			Help: "Proposals admitted by this member that have not committed (or failed) yet."},
			func() float64 { return float64(s.admission.Stats().Outstanding) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "lockd_admission_limit",
			Help: "How many proposals may be outstanding before new work is refused: the measured commit rate times the admission target."},
			func() float64 { return float64(s.admission.Stats().Limit) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "lockd_admission_commit_rate",
			Help: "Admitted proposals returning per second (exponentially weighted): what admission control measures the cluster commits."},
			func() float64 { return s.admission.Stats().Rate }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "lockd_watches",
			Help: "Watches open on this member: WebSocket watches, blocking queries waiting (?index=&wait=) and dashboard streams."},
			func() float64 { return float64(s.watches.Count()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "lockd_is_leader", Help: "1 when this member is the ready leader."},
			func() float64 {
				if s.Ready() {
					return 1
				}
				return 0
			}),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	}
	m.collectors = append(m.collectors, extra...)
	for _, c := range m.collectors {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				s.log.Warn("metric registration failed", "err", err)
			}
		}
	}
	return m
}

// stateCollector reads the lock table's counts and Raft's stats once per
// scrape: both cost a walk (the table's under the lock Apply needs, Raft's
// through its main loop), so each is done once, not once per gauge.
type stateCollector struct {
	s                                *Server
	held, waiters, sessions, token   *prometheus.Desc
	term, commit, applied, snapIndex *prometheus.Desc
	undecodable                      *prometheus.Desc
	logVerified, logMismatches       *prometheus.Desc
	snapFailures                     *prometheus.Desc
	quotaUsed, quotaLimit            *prometheus.Desc
}

func newStateCollector(s *Server) *stateCollector {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }
	return &stateCollector{s: s,
		held:      d("lockd_locks_held", "Locks currently held."),
		waiters:   d("lockd_waiters", "Acquires waiting in lock queues."),
		sessions:  d("lockd_sessions", "Live client sessions."),
		token:     d("lockd_fencing_token_high_water", "Highest fencing token issued."),
		term:      d("lockd_raft_term", "Current Raft term."),
		commit:    d("lockd_raft_commit_index", "Raft commit index."),
		applied:   d("lockd_raft_applied_index", "Raft applied index."),
		snapIndex: d("lockd_raft_last_snapshot_index", "Index of the last snapshot."),
		undecodable: prometheus.NewDesc("lockd_raft_undecodable_entries_total",
			"Committed entries this member skipped because it could not decode them.", nil, nil),
		logVerified: prometheus.NewDesc("lockd_raft_wal_verifier_ranges_verified_total",
			"Log ranges between two checkpoints this member read back equal to what the leader wrote (raft-wal's log verifier).", nil, nil),
		logMismatches: prometheus.NewDesc("lockd_raft_wal_verifier_mismatches_total",
			"Log ranges this member stored or received differently from what the leader wrote: corruption; the member reports not ready.", nil, nil),
		snapFailures: prometheus.NewDesc("lockd_raft_snapshot_failures_total",
			"Snapshots this member failed to write (its own, one sent by the leader, or a restore): a full or failing disk; the log grows until one succeeds.", nil, nil),
		quotaUsed: prometheus.NewDesc("lockd_quota_used",
			"Use of each cluster-wide quota (named by its flag) in the replicated state, as the quota counts it.", []string{"quota"}, nil),
		quotaLimit: prometheus.NewDesc("lockd_quota_limit",
			"Each cluster-wide quota as this member is configured (0: no limit); the leader's value is the one applied.", []string{"quota"}, nil),
	}
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.held, c.waiters, c.sessions, c.token, c.term, c.commit, c.applied, c.snapIndex, c.undecodable,
		c.logVerified, c.logMismatches, c.snapFailures, c.quotaUsed, c.quotaLimit} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	var st locktable.Stats
	type quotaUse struct {
		quota locktable.Quota
		used  int64
	}
	var quotas []quotaUse
	c.s.node.View(func(t *locktable.Table) {
		st = t.Stats()
		for _, q := range locktable.QuotaList() {
			if used, ok := t.ClusterUse(q); ok {
				quotas = append(quotas, quotaUse{q, used})
			}
		}
	})
	g := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	for _, q := range quotas {
		ch <- prometheus.MustNewConstMetric(c.quotaUsed, prometheus.GaugeValue, float64(q.used), q.quota.String())
		ch <- prometheus.MustNewConstMetric(c.quotaLimit, prometheus.GaugeValue, float64(c.s.cfg.Quotas.Limit(q.quota)), q.quota.String())
	}
	ch <- prometheus.MustNewConstMetric(c.snapFailures, prometheus.CounterValue, float64(c.s.node.SnapshotFailures()))
	g(c.held, float64(st.Held))
	g(c.waiters, float64(st.Waiters))
	g(c.sessions, float64(st.Sessions))
	g(c.token, float64(st.LastToken))
	n, _ := c.s.node.Undecodable()
	ch <- prometheus.MustNewConstMetric(c.undecodable, prometheus.CounterValue, float64(n))
	if lc := c.s.node.LogCheck(); lc.Enabled {
		ch <- prometheus.MustNewConstMetric(c.logVerified, prometheus.CounterValue, float64(lc.Verified))
		ch <- prometheus.MustNewConstMetric(c.logMismatches, prometheus.CounterValue, float64(lc.Mismatches))
	}
	rs := c.s.node.Stats()
	for d, key := range map[*prometheus.Desc]string{c.term: "term", c.commit: "commit_index",
		c.applied: "applied_index", c.snapIndex: "last_snapshot_index"} {
		v, _ := strconv.ParseFloat(rs[key], 64)
		g(d, v)
	}
}

func (m *metrics) unregister() {
	for _, c := range m.collectors {
		m.reg.Unregister(c)
	}
}

func (m *metrics) observePropose(op locktable.Op, res locktable.Result, err error, d time.Duration) {
	outcome := "ok"
	switch {
	case errors.Is(err, raftnode.ErrNotLeader):
		outcome = "not_leader"
	case errors.Is(err, raftnode.ErrUnknownOutcome):
		outcome = "unknown"
	case err != nil:
		outcome = "error"
	case res.Code != locktable.OK:
		outcome = res.Code.String()
	}
	m.proposeSeconds.WithLabelValues(op.String(), outcome).Observe(d.Seconds())
	if op == locktable.OpAcquire && err == nil {
		switch {
		case res.Granted:
			m.acquires.WithLabelValues("granted").Inc()
		case res.Queued:
			m.acquires.WithLabelValues("queued").Inc()
		default:
			m.acquires.WithLabelValues(res.Code.String()).Inc()
		}
	}
}

var eventNames = map[locktable.EventKind]string{
	locktable.EvGranted: "granted", locktable.EvQueued: "queued", locktable.EvRenewed: "renewed",
	locktable.EvReleased: "released", locktable.EvLost: "lost", locktable.EvWaitEnded: "wait_ended",
	locktable.EvSessionCreated: "session_created", locktable.EvSessionEnded: "session_ended",
}

// AcquireDone and WebSocketConns implement httpapi.Observer.
func (m *metrics) AcquireDone(outcome string, d time.Duration) {
	m.acquireSeconds.WithLabelValues(outcome).Observe(d.Seconds())
}

func (m *metrics) WebSocketConns(delta int) { m.wsConns.Add(float64(delta)) }

// wsOps are the label values of lockd_websocket_request_duration_seconds;
// any other op (a client's typo) counts as "other", so the series stay few.
var wsOps = []string{api.OpHello, api.OpAcquire, api.OpRelease, api.OpRenew, api.OpKeepalive, api.OpValue,
	api.OpCancel, api.OpWatch, api.OpUnwatch, "other"}

// WebSocketRequestDone implements httpapi.Observer.
func (m *metrics) WebSocketRequestDone(op string, d time.Duration) {
	if !slices.Contains(wsOps, op) {
		op = "other"
	}
	m.wsSeconds.WithLabelValues(op).Observe(d.Seconds())
}

// Refused implements httpapi.Observer: a request refused for want of
// capacity. code is overloaded or resource_exhausted (any other code is
// not such a refusal and is not counted); an op outside refusalOps counts
// as "other", so the series stay few.
func (m *metrics) Refused(code, op string) {
	if !slices.Contains(refusalCodes, code) {
		return
	}
	if !slices.Contains(refusalOps, op) {
		op = "other"
	}
	m.refused.WithLabelValues(code, op).Inc()
}

func (m *metrics) observeEvents(events []locktable.Event) {
	for _, ev := range events {
		kind := eventNames[ev.Kind]
		switch {
		case ev.Kind == locktable.EvGranted && ev.Reason != locktable.ReasonRegrant:
			m.grants.Inc()
		case ev.Kind == locktable.EvReleased:
			m.releases.Inc()
		case ev.Kind == locktable.EvLost && ev.Reason == locktable.ReasonExpired:
			kind = "expired"
			m.expiries.Inc()
		case ev.Kind == locktable.EvWaitEnded && ev.Reason == locktable.ReasonWaitTimeout:
			kind = "wait_timeout"
			m.waitTimeouts.Inc()
		case ev.Kind == locktable.EvSessionEnded && ev.Reason == locktable.ReasonSessionExpired:
			kind = "session_expired"
			m.sessionExpired.Inc()
		}
		m.events.WithLabelValues(kind).Inc()
	}
}
