# The two commands of the README. Each does every set-up step it needs (scripts/setup.sh, idempotent).
.PHONY: demo test test-fast lint setup bench clean

setup:
	@bash scripts/setup.sh
	@.venv/bin/python -m obshub.instrument.native_build  # the C++ collective kernel; a failure prints why, falls back

# demo: 4 simulated hosts, 8% packet loss on node-01 after 15 s; exit 0 only for the right host and layer
# (waits up to 15 min for another demo on this machine to finish: the cluster namespaces are machine-wide)
demo: setup
	@.venv/bin/obshub demo --hosts 4 --fault net-loss --fault-host 1 --lock-wait 900

# lint: the layer contracts (import-linter, [tool.importlinter] in pyproject.toml), ruff lint + format check, mypy on the ground floor
lint: setup
	@.venv/bin/lint-imports
	@.venv/bin/ruff check .
	@.venv/bin/ruff format --check .
	@.venv/bin/mypy

# test: also builds (first time: minutes) and caches the Go programs the deployment tests run for real
# (Prometheus, Alertmanager, helm; tests/support/gobuild.py), which the demo never needs.
# Two passes: the tests that use no broker, BPF, torch or end-to-end run share nothing machine-wide and run
# in two processes (pytest-xdist, whole files per process); then the heavy pass: first the tests that need
# only a broker (marker kafka alone) in two processes, each with its own broker, whole files per process;
# then the rest in one, alone on the machine, as they share its namespaces, cgroups, BPF and timing (markers
# bpf, torch, e2e, or alone: a kafka test with a timing race). Every test of `pytest tests` runs in exactly
# one of these (tests/apps/test_make_test_passes.py; docs/ARCHITECTURE.md "Two passes").
test: lint
	@.venv/bin/python -m tests.support.gobuild
	@.venv/bin/python -m pytest -q -ra -n 2 --dist loadfile -m "not kafka and not bpf and not torch and not e2e and not alone" tests
	@.venv/bin/python -m pytest -q -ra -n 2 --dist loadfile --durations=15 -m "kafka and not bpf and not torch and not e2e and not alone" tests
	@.venv/bin/python -m pytest -q -ra --durations=25 -m "bpf or torch or e2e or alone" tests

# test-fast: the unit tests alone (no broker, no BPF, no torch), in about a minute on 2 cores
test-fast: setup
	@.venv/bin/python -m pytest -q -m "not kafka and not bpf and not torch and not e2e and not alone and not slow" tests

bench: setup
	@.venv/bin/python -m bench

clean:
	rm -rf .venv build *.egg-info
