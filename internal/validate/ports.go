package validate

import (
	"fmt"
	"strconv"
	"strings"
)

// LBPort reads one --lb-port value, PORT or PORT:BACKENDPORT, each
// 1-65535; backend is 0 when not given.
func LBPort(v string) (port, backend int, err error) {
	bad := fmt.Errorf("`lbPort` %q: want PORT or PORT:BACKENDPORT, each 1-65535", v)
	p, b, hasBackend := strings.Cut(strings.TrimSpace(v), ":")
	if port, err = strconv.Atoi(p); err != nil || port < 1 || port > 65535 {
		return 0, 0, bad
	}
	if hasBackend {
		if backend, err = strconv.Atoi(b); err != nil || backend < 1 || backend > 65535 {
			return 0, 0, bad
		}
	}
	return port, backend, nil
}

// PortCheck reads one --lb-port-check value, PORT=tcp or PORT=/PATH; the
// path's form is the caller's to check.
func PortCheck(v string) (port int, check string, err error) {
	ps, check, ok := strings.Cut(v, "=")
	port, err = strconv.Atoi(ps)
	if !ok || err != nil || port < 1 || port > 65535 || (check != "tcp" && !strings.HasPrefix(check, "/")) {
		return 0, "", fmt.Errorf("`lbPortCheck` %q: want PORT=tcp or PORT=/PATH", v)
	}
	return port, check, nil
}
