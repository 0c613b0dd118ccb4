//go:build !linux

package netmon

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
)

// Monitor needs netlink: Linux only.
type Monitor struct{}

func New(*slog.Logger) (*Monitor, error) {
	return nil, errors.New("netmon: following links and addresses is only supported on Linux")
}

func (*Monitor) Run(context.Context)                            {}
func (*Monitor) Changes() <-chan struct{}                       { return nil }
func (*Monitor) Link(string) (Link, error)                      { return Link{}, ErrNoLink }
func (*Monitor) InterfaceByName(string) (*net.Interface, error) { return nil, ErrNoLink }
func (*Monitor) Addrs() []netip.Addr                            { return nil }
func (*Monitor) Close()                                         {}
