"""A local Kubernetes control plane built from the official sources (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler) with kwok-simulated nodes: what the integration tests run against."""
