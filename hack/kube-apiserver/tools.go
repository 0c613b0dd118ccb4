//go:build tools

// Package tools names the kube-apiserver command so that go.mod and go.sum
// keep every module it needs.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
