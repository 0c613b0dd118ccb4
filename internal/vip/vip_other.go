//go:build !linux

package vip

import (
	"context"
	"errors"
)

func openLink(string) (link, error) {
	return nil, errors.New("vip: managing addresses is only supported on Linux")
}

func subscribe(context.Context) (<-chan struct{}, func(), error) {
	return nil, nil, errors.New("vip: netlink events are only supported on Linux")
}
