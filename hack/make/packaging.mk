# Packaging: images, the Helm chart and the rendered kubectl manifest (issue 5; docs/packaging.md).
HELM ?= $(shell $(PY) -c "from tests.cluster.controlplane import tool; print(tool('helm'))" 2>/dev/null)
CHART := charts/ddpjob-operator
CRD_SRC := operator/ddpjob_operator/crd/ddpjob-crd.yaml
# Namespace and release name that manifests/install.yaml is rendered for.
INSTALL_NAMESPACE ?= ddpjob-system
INSTALL_RELEASE ?= ddpjob-operator

.PHONY: images
images: venv ## Build ddpjob-operator, ddpjob-worker and ddpjob-runtime :dev (operator, runtime also :appVersion; cached)
	@bash hack/images.sh

.PHONY: images-e2e
images-e2e: venv ## `make images` plus the e2e tier's plain user image ddpjob-plain:torch-<oldest supported> (~5.6 GB)
	@bash hack/images.sh --e2e

.PHONY: push
push: ## Tag and push the images to a registry (REGISTRY=host/path make images push; chart value imageRegistry=host/path)
	@bash hack/push-images.sh

.PHONY: images-stop
images-stop: ## Stop the dockerd that `make images` started (if it did)
	@bash hack/images.sh --stop

.PHONY: chart-crd
chart-crd: ## Copy the CRD (single source: operator/ddpjob_operator/crd/) into the chart's files/ (templates/crd.yaml)
	@test -f $(CRD_SRC) || { echo "missing $(CRD_SRC)"; exit 1; }
	@mkdir -p $(CHART)/files
	@cp $(CRD_SRC) $(CHART)/files/ddpjob-crd.yaml
	@echo "copied $(CRD_SRC) -> $(CHART)/files/ddpjob-crd.yaml"

.PHONY: chart-readme
chart-readme: venv ## Regenerate the chart's README.md (its values table from values.schema.json and values.yaml)
	@$(PY) hack/chart_readme.py $(CHART) > $(CHART)/README.md.tmp && mv $(CHART)/README.md.tmp $(CHART)/README.md
	@echo "wrote $(CHART)/README.md"

.PHONY: manifests
manifests: venv tools chart-crd ## Render manifests/install.yaml from the chart (helm template, CRD included)
	@bash hack/render-manifests.sh "$(HELM)" $(CHART) $(INSTALL_RELEASE) $(INSTALL_NAMESPACE) > manifests/install.yaml.tmp
	@mv manifests/install.yaml.tmp manifests/install.yaml
	@echo "rendered manifests/install.yaml"

.PHONY: dist
dist: venv tools chart-crd ## Build dist/: the ddpjob wheel (kubectl-ddpjob included) and the chart archive (helm package)
	@PY=$(PY) HELM="$(HELM)" DIST=$(or $(DIST),dist) bash hack/dist.sh

.PHONY: chart-lint
chart-lint: venv tools ## helm lint --strict the chart, with defaults and with watchNamespaces set
	@$(HELM) lint --strict $(CHART)
	@$(HELM) lint --strict $(CHART) --set 'watchNamespaces={team-a,team-b}'

# Where `make images-save` writes the docker-archive tarballs (for `make node-import IMAGES=...`).
IMAGE_TARS ?= $(or $(DDPJOB_CACHE),$(HOME)/.cache/ddpjob)/image-tars

.PHONY: images-save
images-save: images ## docker save the three :dev images to ~/.cache/ddpjob/image-tars/ (skipped while the image is unchanged)
	@mkdir -p $(IMAGE_TARS)
	@docker=$$(test -x /usr/bin/docker && echo /usr/bin/docker || echo docker); \
	for img in ddpjob-operator ddpjob-worker ddpjob-runtime; do \
	  id=$$($$docker image inspect -f '{{.Id}}' $$img:dev | cut -c8-19); tar=$(IMAGE_TARS)/$$img-dev-$$id.tar; \
	  if [ ! -f $$tar ]; then rm -f $(IMAGE_TARS)/$$img-dev-*.tar; $$docker save -o $$tar.tmp $$img:dev && mv $$tar.tmp $$tar; fi; \
	  echo $$tar; \
	done
