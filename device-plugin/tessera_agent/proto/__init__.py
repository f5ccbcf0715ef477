"""Kubelet gRPC APIs, upstream protos and their generated modules (hack/gen-protos): device plugin v1beta1
(`api`), DRA plugin v1 (`dra_v1`), DRA resource health v1
(`dra_health_v1`) and plugin registration v1 (`pluginregistration_v1`)."""
