package lb

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	backendUp  *prometheus.GaugeVec
	active     *prometheus.GaugeVec
	accepted   *prometheus.CounterVec
	dialErrors *prometheus.CounterVec
	closed     *prometheus.CounterVec
	bytes      *prometheus.CounterVec
	rejected   prometheus.Counter
	refused    *prometheus.CounterVec
	usable     prometheus.Gauge
	known      prometheus.Gauge
	toBackend  prometheus.Counter
	toClient   prometheus.Counter
}

func newMetrics() *metrics {
	m := &metrics{
		backendUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vigil_lb_backend_up", Help: "1 if the backend takes new connections (passed its health checks), else 0.",
		}, []string{"backend"}),
		active: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vigil_lb_connections_active", Help: "Connections being proxied to the backend.",
		}, []string{"backend"}),
		accepted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vigil_lb_connections_total", Help: "Connections proxied to the backend.",
		}, []string{"backend"}),
		dialErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vigil_lb_dial_errors_total", Help: "Failed connection attempts to the backend (the client was sent to another one).",
		}, []string{"backend"}),
		closed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vigil_lb_connections_closed_total", Help: "Connections closed by vigil, by reason.",
		}, []string{"reason"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vigil_lb_bytes_total", Help: "Bytes proxied in finished connections, by direction.",
		}, []string{"direction"}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vigil_lb_rejected_total", Help: "Client connections closed because no backend was usable.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vigil_lb_refused_total", Help: "Client connections reset at once because a connection limit was reached, by limit (max_conns, max_conns_per_source).",
		}, []string{"limit"}),
		usable: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vigil_lb_backends_usable", Help: "Backends taking new connections; 0 means the load balancer is degraded.",
		}),
		known: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vigil_lb_backends", Help: "Backends known from discovery.",
		}),
	}
	m.toBackend, m.toClient = m.bytes.WithLabelValues("to_backend"), m.bytes.WithLabelValues("to_client")
	return m
}

func (m *metrics) register(r prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.backendUp, m.active, m.accepted, m.dialErrors, m.closed, m.bytes, m.rejected, m.refused, m.usable, m.known} {
		if err := r.Register(c); err != nil {
			return fmt.Errorf("register load balancer metrics: %w", err)
		}
	}
	return nil
}

// forget drops a removed backend's series.
func (m *metrics) forget(addr string) {
	m.backendUp.DeleteLabelValues(addr)
	m.active.DeleteLabelValues(addr)
	m.accepted.DeleteLabelValues(addr)
	m.dialErrors.DeleteLabelValues(addr)
}

// backendMetrics are one backend's series, looked up once instead of on
// every connection.
type backendMetrics struct {
	active   prometheus.Gauge
	accepted prometheus.Counter
}

func (m *metrics) forBackend(addr string) backendMetrics {
	return backendMetrics{active: m.active.WithLabelValues(addr), accepted: m.accepted.WithLabelValues(addr)}
}
