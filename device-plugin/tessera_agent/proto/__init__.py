"""Kubelet device plugin API v1beta1: the upstream proto and its generated modules (hack/gen-protos)."""
