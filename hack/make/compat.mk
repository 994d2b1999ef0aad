# The torch matrix (issue 22): the worker runtime's tests under every torch of TORCH_COMPAT_VERSIONS
# (hack/versions.env), one cached venv per release (~6 GB each, built once per machine; hack/compat.sh).
# TORCH_VERSIONS picks releases for one run: make test-compat TORCH_VERSIONS=2.6.0
TORCH_VERSIONS ?=

.PHONY: test-compat
test-compat: venv ## Run tests/worker and tests/unit/worker under each torch of hack/versions.env; prints a table
	@$(TIMED) test-compat bash hack/compat.sh $(TORCH_VERSIONS)
