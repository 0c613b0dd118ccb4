//go:build !linux

package announce

import (
	"errors"
	"net"
	"net/netip"
)

type osSender struct{}

func (osSender) send(*net.Interface, netip.Addr) error {
	return errors.New("announce: only supported on Linux")
}
