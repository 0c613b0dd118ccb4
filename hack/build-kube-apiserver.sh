#!/usr/bin/env bash
# Builds the real kube-apiserver into bin/ (kept for existing scripts and
# docs; hack/build-kube.sh builds it and, with --all, the other Kubernetes
# binaries the kubeadm lab needs).
exec "$(dirname "$0")/build-kube.sh"
