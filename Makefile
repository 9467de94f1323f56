# The two commands of the README. Each does every set-up step it needs (scripts/setup.sh, idempotent).
.PHONY: demo test setup bench clean

setup:
	@bash scripts/setup.sh

demo: setup
	@.venv/bin/obshub up && .venv/bin/obshub status

test: setup
	@.venv/bin/python -m pytest -q -ra tests

bench: setup
	@.venv/bin/python -m bench

clean:
	rm -rf .venv build *.egg-info
