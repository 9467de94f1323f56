# The two commands of the README. Each does every set-up step it needs (scripts/setup.sh, idempotent).
.PHONY: demo test setup bench clean

setup:
	@bash scripts/setup.sh

# demo: 4 simulated hosts, 8% packet loss on node-01 after 15 s; exit 0 only for the right host and layer
demo: setup
	@.venv/bin/obshub demo --hosts 4 --fault net-loss --fault-host 1

test: setup
	@.venv/bin/python -m pytest -q -ra --durations=15 tests

bench: setup
	@.venv/bin/python -m bench

clean:
	rm -rf .venv build *.egg-info
