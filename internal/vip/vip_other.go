//go:build !linux

package vip

import "errors"

func openLink(string) (link, error) {
	return nil, errors.New("vip: managing addresses is only supported on Linux")
}
