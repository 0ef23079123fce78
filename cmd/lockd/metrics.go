package main

import (
	"time"

	gometrics "github.com/armon/go-metrics"
	gmprom "github.com/armon/go-metrics/prometheus"
	"github.com/prometheus/client_golang/prometheus"
)

// bridgeRaftMetrics sends hashicorp/raft's own metrics (commit time, FSM
// apply time, snapshot create/persist, leader contact, ...) to the
// Prometheus registry the server exposes on /metrics. hashicorp/raft
// reports through go-metrics' process-wide sink, so this is done once per
// process, here, and not in the server package (which must stay free of
// globals so several members can share one test process).
func bridgeRaftMetrics(reg prometheus.Registerer) error {
	sink, err := gmprom.NewPrometheusSinkFrom(gmprom.PrometheusOpts{
		Registerer: reg,
		Expiration: 10 * time.Minute,
	})
	if err != nil {
		return err
	}
	cfg := gometrics.DefaultConfig("lockd")
	cfg.EnableHostname = false
	cfg.EnableRuntimeMetrics = false // the Go collector already covers these
	cfg.EnableServiceLabel = false
	_, err = gometrics.NewGlobal(cfg, sink)
	return err
}
