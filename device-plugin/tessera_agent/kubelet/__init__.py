"""The kubelet-facing APIs: the device plugin (Allocate and the lane audit against PodResources) and the DRA
driver (ResourceSlices, NodePrepareResources and the claims' CDI specs)."""
