package daemon

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vigil-ha/vigil/internal/health"
	"github.com/vigil-ha/vigil/internal/lb"
	"github.com/vigil-ha/vigil/internal/validate"
)

// PortSpec is a load-balanced port besides the first --lb-port: clients
// reach VIP:Port, and the balancer sends them to BackendPort on each
// backend host (the hosts discovery finds for the API servers), checked on
// that port by Check.
type PortSpec struct {
	Port        int
	BackendPort int
	// Check is CheckTCP (accepts a TCP connection) or an HTTPS path, such
	// as /ping, that must answer 200. Validate fills in CheckTCP.
	Check string
}

// CheckTCP is the --lb-port-check that only opens a TCP connection.
const CheckTCP = health.SchemeTCP

// String is the spec as --lb-port takes it.
func (p PortSpec) String() string {
	if p.BackendPort == p.Port {
		return strconv.Itoa(p.Port)
	}
	return fmt.Sprintf("%d:%d", p.Port, p.BackendPort)
}

// SetLBPorts sets the load-balanced ports from --lb-port's values. The
// first is LBPort; its BACKENDPORT, if given, is BackendPort, which
// --backend-port (backendPortGiven) must then not contradict. Each further
// value is a PortSpec; a bare PORT there goes to the same port on the
// backends. "0" alone (the default) is no load balancer.
func (c *Config) SetLBPorts(values []string, backendPortGiven bool) error {
	c.LBPort, c.MorePorts = 0, nil
	if len(values) == 1 && strings.TrimSpace(values[0]) == "0" {
		return nil
	}
	for i, v := range values {
		port, backend, err := validate.LBPort(v)
		if err != nil {
			return validate.Invalid(err)
		}
		if i > 0 {
			if backend == 0 {
				backend = port
			}
			c.MorePorts = append(c.MorePorts, PortSpec{Port: port, BackendPort: backend})
			continue
		}
		c.LBPort = port
		if backend != 0 {
			if backendPortGiven && c.BackendPort != backend {
				return fmt.Errorf("%w: `lbPort` %s sends to port %d, `backendPort` says %d: give one of them", validate.ErrInvalid, v, backend, c.BackendPort)
			}
			c.BackendPort = backend
		}
	}
	return nil
}

// validatePorts checks the ports besides the first and --lb-port-check,
// and fills in each port's check: no port given twice (nor as
// --lb-listen-port), every check for a load-balanced port, at most one
// each. A check for the first port replaces --health-path.
func (c *Config) validatePorts() error {
	if len(c.MorePorts) > 0 && c.LBPort == 0 {
		return fmt.Errorf("%w: more than one `lbPort`, yet no first one", validate.ErrInvalid)
	}
	seen := map[int]string{}
	use := func(port int, as string) error {
		if port == 0 {
			return nil
		}
		if prev, ok := seen[port]; ok {
			return fmt.Errorf("%w: port %d given twice (%s and %s): each load-balanced port is served once", validate.ErrInvalid, port, prev, as)
		}
		seen[port] = as
		return nil
	}
	if err := use(c.LBPort, "`lbPort`"); err != nil {
		return err
	}
	if err := use(c.LBListenPort, "`lbListenPort`"); err != nil {
		return err
	}
	for i, p := range c.MorePorts {
		if p.Port < 1 || p.Port > 65535 || p.BackendPort < 1 || p.BackendPort > 65535 {
			return fmt.Errorf("%w: `lbPort` %s is out of range 1-65535", validate.ErrInvalid, p)
		}
		if err := use(p.Port, "`lbPort`"); err != nil {
			return err
		}
		if p.Check == "" {
			c.MorePorts[i].Check = CheckTCP
		}
	}
	checked := map[int]bool{}
	for _, v := range c.PortChecks {
		port, check, err := validate.PortCheck(v)
		if err != nil {
			return validate.Invalid(err)
		}
		if check != CheckTCP {
			if err := health.ValidatePath(check); err != nil {
				return fmt.Errorf("%w: `lbPortCheck` %q: want PORT=tcp or PORT=/PATH: %w", validate.ErrInvalid, v, err)
			}
		}
		if checked[port] {
			return fmt.Errorf("%w: `lbPortCheck` for port %d given twice", validate.ErrInvalid, port)
		}
		checked[port] = true
		switch i := slices.IndexFunc(c.MorePorts, func(p PortSpec) bool { return p.Port == port }); {
		case port != 0 && port == c.LBPort:
			if c.HealthPath != "" && c.HealthPath != health.DefaultPath && c.HealthPath != check {
				return fmt.Errorf("%w: `lbPortCheck` %q and `healthPath` %s both say how port %d is checked: give one", validate.ErrInvalid, v, c.HealthPath, port)
			}
			c.HealthTCP = check == CheckTCP
			if !c.HealthTCP {
				c.HealthPath = check
			}
		case i >= 0:
			c.MorePorts[i].Check = check
		default:
			return fmt.Errorf("%w: `lbPortCheck` %q: port %d is not an `lbPort`", validate.ErrInvalid, v, port)
		}
	}
	return nil
}

// healthScheme is how the first port's backends (the API servers) are
// checked.
func (c *Config) healthScheme() string {
	if c.HealthTCP {
		return health.SchemeTCP
	}
	return "https"
}

// servedPort is one load-balanced port besides the first: its balancer and
// the health checks of its backends. The first port's are the node's
// bal and checker, whose health is also the API servers'.
type servedPort struct {
	spec    PortSpec
	bal     *lb.Balancer
	checker *health.Checker
}

// setBackends gives the port the API servers' hosts, each with the port's
// backend port.
func (p *servedPort) setBackends(apiservers []string) {
	var out []string
	for _, b := range apiservers {
		host, _, err := net.SplitHostPort(b)
		if err != nil {
			continue
		}
		if a := net.JoinHostPort(host, strconv.Itoa(p.spec.BackendPort)); !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	p.bal.SetBackends(out)
	p.checker.Set(out)
}

// portRegisterer labels a port's load balancer and health check metrics
// with the port clients use.
func portRegisterer(reg prometheus.Registerer, port int) prometheus.Registerer {
	return prometheus.WrapRegistererWith(prometheus.Labels{"port": strconv.Itoa(port)}, reg)
}

// listenAddrs are a balancer's addresses for port: the VIP's, one per
// family.
func listenAddrs(cfg Config, port int) (first string, also []string) {
	for i, v := range cfg.VIPs {
		a := netip.AddrPortFrom(v.Addr(), uint16(port)).String()
		if i == 0 {
			first = a
		} else {
			also = append(also, a)
		}
	}
	return first, also
}

// balancers are every load-balanced port's balancer, the first port's
// first; the holder and the handoff treat them as one.
type balancers []*lb.Balancer

func (bs balancers) SetServing(on bool) {
	for _, b := range bs {
		b.SetServing(on)
	}
}

func (bs balancers) Busy(quiet time.Duration) (busy, total int) {
	for _, b := range bs {
		x, t := b.Busy(quiet)
		busy, total = busy+x, total+t
	}
	return busy, total
}

func (bs balancers) CloseAll(reason string) {
	for _, b := range bs {
		b.CloseAll(reason)
	}
}
