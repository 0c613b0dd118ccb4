package main

import (
	"strings"

	"github.com/vigil-ha/vigil/internal/validate"
)

// portsFlag is --lb-port: a list of PORT or PORT:BACKENDPORT, given as a
// comma-separated list, repeated, or both, each checked as it is set, so a
// bad value from a VIGIL_* variable or the config file is reported with
// where it came from.
type portsFlag struct {
	ports   *[]string
	changed bool
}

func newPortsFlag(p *[]string) *portsFlag { return &portsFlag{ports: p} }

func (f *portsFlag) String() string { return "[" + strings.Join(*f.ports, ",") + "]" }

func (f *portsFlag) Type() string { return "ports" }

// Set adds the values of one --lb-port; the first replaces the default.
func (f *portsFlag) Set(v string) error {
	vals := strings.Split(v, ",")
	if err := checkPorts(vals); err != nil {
		return err
	}
	if !f.changed {
		*f.ports = nil
		f.changed = true
	}
	*f.ports = append(*f.ports, vals...)
	return nil
}

func (f *portsFlag) Append(v string) error { return f.Set(v) }

func (f *portsFlag) Replace(vals []string) error {
	if err := checkPorts(vals); err != nil {
		return err
	}
	*f.ports = append([]string(nil), vals...)
	f.changed = true
	return nil
}

func (f *portsFlag) GetSlice() []string { return append([]string(nil), *f.ports...) }

func checkPorts(vals []string) error {
	for _, v := range vals {
		if strings.TrimSpace(v) == "0" {
			continue // no load balancer
		}
		if _, _, err := validate.LBPort(v); err != nil {
			return err
		}
	}
	return nil
}
