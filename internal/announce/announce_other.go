//go:build !linux

package announce

import (
	"errors"
	"net"
	"net/netip"
)

type osSender struct{}

func newSender() sender { return osSender{} }

func (osSender) send(*net.Interface, netip.Addr) error {
	return errors.New("announce: only supported on Linux")
}

func (osSender) prepare(*net.Interface, netip.Addr) error { return nil }

func (osSender) close() {}
