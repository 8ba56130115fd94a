# The two commands a newcomer needs; both do all set-up first.
.PHONY: setup demo test bench contracts

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/aitbc distributed-training run --dataset digits --workers 4 --rounds 5 --plot training.png

test: setup
	.venv/bin/python -m pytest -q

bench: setup
	.venv/bin/python bench/run_all.py

contracts: setup
	bash scripts/build_contracts.sh
