// Package health checks API server backends: HTTPS GET /readyz with an
// interval, a timeout and rise/fall counts, one goroutine per backend.
//
// A failure is either Draining (the server answered, but not 200: a
// kube-apiserver inside its --shutdown-delay-duration) or Dead (no answer).
// The balancer sends no new connections to either, closes established
// connections to a Dead backend at once, and lets those to a Draining one
// finish. The data path can also mark a backend dead the moment a connection
// to it is refused (MarkDead), so a killed API server is ejected before its
// next check.
//
//	c, _ := health.New(health.Config{TLS: tc, OnChange: lb.Update}, log)
//	c.Set([]string{"10.0.0.11:6443", "10.0.0.12:6443"})
//	defer c.Close()
package health
