# Real node (issue 6; docs/real-node.md). `make cluster-up NODE=real` (the cluster-up recipe forwards NODE) starts
# the control plane plus a real node: containerd, kubelet, kube-proxy, CoreDNS. `make cluster-down` removes it all.
NODE ?=
# With NODE=real: how many real nodes (node 1.. in network namespaces; docs/real-node.md).
NODES ?= 1
IMAGES ?=

.PHONY: node-tools
node-tools: ## Install the real node's Debian packages (containerd, CNI plugins, ...) and build kubelet, kube-proxy, CoreDNS (cached)
	@$(TIMED) node-packages bash hack/node-packages.sh
	@$(TIMED) node-tools bash hack/install-tools.sh --node $(if $(filter 0,$(ADDONS)),--core)

.PHONY: node-import
node-import: ## Import image tarballs (docker save) into the real node: make node-import IMAGES="a.tar b.tar"
	@test -n "$(IMAGES)" || { echo 'usage: make node-import IMAGES="a.tar ..." [CLUSTER_DIR=.cluster]'; exit 2; }
	@$(PY) -c 'import sys; from pathlib import Path; from tests.cluster.node_images import import_images; \
		import_images(Path(sys.argv[1]), [Path(a) for a in sys.argv[2:]])' $(CLUSTER_DIR) $(IMAGES)
