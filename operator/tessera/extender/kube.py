"""The extender's API calls: list/watch nodes and pods, read and annotate a pod, bind it.

All go through Tessera's one client (`tessera.kube`); credentials from a kubeconfig or the in-cluster
service account (`KubeConfig.from_kubeconfig`, `KubeConfig.in_cluster`).
"""

from tessera.kube import JsonObj, KubeClient, KubeConfig, KubeError

__all__ = ["JsonObj", "KubeClient", "KubeConfig", "KubeError"]
