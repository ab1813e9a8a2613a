"""Kubernetes and the NVIDIA GPU Operator: the backend Protocol, its implementation over the
official ``kubernetes`` client, the ``k8s.*``/``gpu_operator.*`` actions and a Lease-based
leader election helper.

    config = KubernetesConfig(kubeconfig="~/.kube/config")
    actions = KubernetesActions(ClientBackend(config), config).all()
"""
