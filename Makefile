# Each target runs one of scripts/, which set up .venv on first use. `make` lists them.
.DEFAULT_GOAL := help
.PHONY: help dev test lint migrate lock

help: ## list the targets
	@awk 'BEGIN { FS = ":.*## " } /^[a-z]+:.*## / { printf "  make %-8s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

dev: ## run worker, beat, Flower and a mail catcher here until Ctrl-C (scripts/dev)
	scripts/dev

test: ## ruff, mypy and pytest (scripts/test); pytest arguments in ARGS, e.g. ARGS="-m 'not slow'"
	scripts/test $(ARGS)

lint: ## ruff and mypy only (scripts/test --lint-only)
	scripts/test --lint-only

migrate: ## create the database if needed and apply the migrations (scripts/dev migrate)
	scripts/dev migrate

lock: ## pin every runtime dependency, with hashes, into requirements.lock (scripts/lock)
	scripts/lock
