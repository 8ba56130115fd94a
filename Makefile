# The two commands a newcomer needs; both do all set-up first.
.PHONY: setup demo test bench contracts chaos

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/aitbc distributed-training run --dataset digits --workers 4 --rounds 5 --plot training.png

test: setup
	.venv/bin/python -m pytest -q -n 2 --dist loadfile --durations=25

bench: setup
	.venv/bin/python bench/run_all.py

contracts: setup
	bash scripts/build_contracts.sh

# Faults injected into real devnet trainings (all scenarios; --quick for the CI subset).
chaos: setup
	.venv/bin/python scripts/chaos/run_chaos.py
