# End-to-end tests and the demo (issue 6; docs/e2e.md). Real DDP training on a real node with failures injected.
E2E_ARGS ?=

.PHONY: e2e
e2e: venv tools node-tools ## Build the images, then tests/images and tests/e2e on a local real node (root)
	PY=$(PY) E2E_ARGS="$(E2E_ARGS)" bash hack/e2e.sh

.PHONY: e2e-extended
e2e-extended: venv tools node-tools ## The e2e runs left out of `make e2e`: users' frameworks, the object store, every example (root)
	PY=$(PY) E2E_ARGS="$(E2E_ARGS)" E2E_MARK="e2e and extended" bash hack/e2e.sh

# kind recipe (a laptop with Docker), same suite against the current KUBECONFIG:
#   make images && kind create cluster
#   kind load docker-image ddpjob-operator:0.1.0 ddpjob-worker:dev ddpjob-runtime:0.1.0   # images-e2e: + ddpjob-plain
#   hack/node/build-images.sh /tmp/img && kind load image-archive /tmp/img/*/probe.tar   # test_real_node only
#   make e2e-kind
.PHONY: e2e-kind
e2e-kind: venv tools ## Run tests/e2e against the current KUBECONFIG (e.g. kind after `kind load docker-image`)
	@test -n "$$KUBECONFIG" || { echo "set KUBECONFIG (kind: kind get kubeconfig > /tmp/kind.kubeconfig)"; exit 2; }
	DDPJOB_REQUIRE_KUBECONFIG=1 $(PY) -m pytest tests/e2e -m e2e --durations=0 $(E2E_ARGS)

# DEMO_DOWN=1 tears the cluster down at the end; otherwise it stays up (make cluster-down removes it).
DEMO_DOWN ?=
.PHONY: demo
demo: ## Real-node cluster + Helm-installed operator + the CPU example, followed live to Succeeded (builds only what it needs)
	@PY=$(PY) CLUSTER_DIR=$(CLUSTER_DIR) DEMO_DOWN=$(DEMO_DOWN) bash hack/demo.sh
