"""The lab's Kubernetes API server: a stdlib-only HTTP fake that follows the real API.

It serves what kubectl, the `kubernetes` Python client and the bot use (discovery, nodes,
pods with eviction, DaemonSets, PodDisruptionBudgets, Leases, the GPU Operator's custom
resources) and runs small lab controllers (ReplicaSet/DaemonSet pods, the GPU Operator's
driver upgrade). See deploy/lab/README.md, section "Kubernetes API".
"""
