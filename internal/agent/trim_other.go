//go:build !linux

package agent

func trimExecutable() (int, error) { return 0, nil }
