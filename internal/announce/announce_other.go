//go:build !linux

package announce

import (
	"errors"
	"net"
	"net/netip"
	"time"
)

type osSender struct{}

func newSender() sender { return osSender{} }

func (osSender) send(*net.Interface, netip.Addr) error {
	return errors.New("announce: only supported on Linux")
}

func (osSender) prepare(*net.Interface, netip.Addr) error { return nil }

func (osSender) close() {}

// Probe is only supported on Linux.
func Probe(*net.Interface, netip.Addr, time.Duration) ([]net.HardwareAddr, error) {
	return nil, errors.New("announce: only supported on Linux")
}
