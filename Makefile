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
# in two processes (pytest-xdist, whole files per process); then the rest in one, as they share the
# machine's namespaces, cgroups and timing. Every test of `pytest tests` runs, in one pass or the other.
test: lint
	@.venv/bin/python -m tests.support.gobuild
	@.venv/bin/python -m pytest -q -ra -n 2 --dist loadfile -m "not kafka and not bpf and not torch and not e2e" tests
	@.venv/bin/python -m pytest -q -ra --durations=25 -m "kafka or bpf or torch or e2e" tests

# test-fast: the unit tests alone (no broker, no BPF, no torch), in about a minute on 2 cores
test-fast: setup
	@.venv/bin/python -m pytest -q -m "not kafka and not bpf and not torch and not e2e and not slow" tests

bench: setup
	@.venv/bin/python -m bench

clean:
	rm -rf .venv build *.egg-info
