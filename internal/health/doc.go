// Package health checks API server backends: HTTPS GET /readyz with an
// interval, a timeout and rise/fall counts, one goroutine per backend.
//
// A failure has a cause, which decides what happens to connections already
// established to the backend:
//
//   - Draining: the server answered, but not 200 (a kube-apiserver inside
//     its --shutdown-delay-duration). Its connections are left to finish.
//   - Dead: the connection was refused, so the process is gone. Its
//     connections are closed at once.
//   - Unreachable: no answer in time, or another failure (a paused or
//     overloaded process, a path that broke). Its connections are left
//     alone for the balancer's grace period, and closed only if the backend
//     stays unreachable that long.
//
// The balancer sends no new connections to a backend that is down for any
// cause. The data path reports its own failed connections (DialFailed): a
// refused one marks the backend Dead at once, so a killed API server is
// ejected before its next check; a timed-out one counts as a failed check.
//
//	c, _ := health.New(health.Config{TLS: tc, OnChange: lb.Update}, log)
//	c.Set([]string{"10.0.0.11:6443", "10.0.0.12:6443"})
//	defer c.Close()
package health
